//! What a failed call or a failed batch entry means for the relay (transient, unavailable,
//! permanent), and its text in one line.

use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

#[cfg(any(feature = "sqs", feature = "sns"))]
use super::Prepared;
use crate::publish::PublishError;

/// Error codes (of a call or of one batch entry) that mean the service is throttling us.
fn is_throttling(code: &str) -> bool {
    matches!(
        code,
        "Throttling"
            | "ThrottlingException"
            | "ThrottledException"
            | "Throttled"
            | "RequestThrottled"
            | "RequestThrottledException"
            | "TooManyRequestsException"
            | "KmsThrottled"
            | "KMSThrottling"
            | "KMSThrottlingException"
            | "SlowDown"
            | "ProvisionedThroughputExceededException"
            | "LimitExceededException"
    ) || code.ends_with("OverLimit")
        || code == "AWS.SimpleQueueService.RequestThrottled"
}

/// Codes of one batch entry that no retry of the same message will fix.
fn is_permanent_entry(code: &str) -> bool {
    matches!(
        code,
        "InvalidParameterValue"
            | "InvalidParameterValueException"
            | "InvalidParameter"
            | "InvalidParameterException"
            | "ParameterValueInvalid"
            | "InvalidMessageContents"
            | "InvalidAttributeName"
            | "InvalidAttributeValue"
            | "MessageTooLong"
            | "ValidationError"
            | "ValidationException"
            | "InvalidArgumentException"
            | "AWS.SimpleQueueService.InvalidMessageContents"
    )
}

/// Codes of a whole call that say the destination, the credentials or the permissions are
/// wrong: the operator's to fix, never the message's fault, so never dead-lettered.
fn is_setup_error(code: &str) -> bool {
    matches!(
        code,
        "AccessDenied"
            | "AccessDeniedException"
            | "AuthorizationError"
            | "InvalidClientTokenId"
            | "UnrecognizedClientException"
            | "SignatureDoesNotMatch"
            | "IncompleteSignature"
            | "MissingAuthenticationToken"
            | "ExpiredToken"
            | "ExpiredTokenException"
            | "InvalidSecurity"
            | "InvalidAddress"
            | "QueueDoesNotExist"
            | "AWS.SimpleQueueService.NonExistentQueue"
            | "NotFound"
            | "NotFoundException"
            | "KMSAccessDenied"
            | "KMSDisabled"
            | "KMSNotFound"
            | "KMSInvalidState"
            | "KMSAccessDeniedException"
            | "KMSDisabledException"
            | "KMSNotFoundException"
            | "KMSInvalidStateException"
            | "KMSOptInRequired"
            | "ResourceNotFoundException"
            | "OptInRequired"
            | "InvalidAction"
    )
}

/// One failed batch entry: permanent for a message the service refuses as it is, transient
/// otherwise (throttling, a failure on the service's side).
pub(crate) fn entry_error(
    what: &str,
    code: &str,
    message: Option<&str>,
    sender_fault: bool,
) -> PublishError {
    let text = format!(
        "{what}: refused ({code}{}): {}",
        if sender_fault {
            ""
        } else {
            ", the service's fault"
        },
        message.unwrap_or("no message")
    );
    if is_throttling(code) {
        PublishError::transient(format!("{text} (throttled)"))
    } else if is_permanent_entry(code) {
        PublishError::permanent(text)
    } else if is_setup_error(code) {
        PublishError::unavailable(text)
    } else {
        PublishError::transient(text)
    }
}

/// A failed call: no answer (unreachable, timed out, cut off) is *unavailable*; so are
/// refused credentials or permissions and a missing queue or topic, and a failure on the
/// service's side (5xx); throttling is *transient*; a refused request otherwise is
/// *permanent* only when the code says the input is invalid, else *transient*. The text is
/// one line ([`describe`]), never the credentials.
pub(crate) fn call_error<E>(
    what: &str,
    e: &SdkError<E, aws_smithy_runtime_api::http::Response>,
) -> PublishError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let text = format!("{what}: {}", describe(e));
    match e {
        SdkError::ServiceError(ctx) => {
            let code = ctx.err().code().unwrap_or("");
            let status = ctx.raw().status().as_u16();
            if is_throttling(code) || status == 429 {
                PublishError::transient(format!("{text} (throttled)"))
            } else if is_setup_error(code) || status == 401 || status == 403 || status >= 500 {
                PublishError::unavailable(text)
            } else if is_permanent_entry(code) {
                PublishError::permanent(text)
            } else {
                PublishError::transient(text)
            }
        }
        SdkError::ConstructionFailure(_) => PublishError::transient(text),
        // Dispatch failures (no connection, no credentials), timeouts, broken answers.
        _ => PublishError::unavailable(text),
    }
}

/// A failed call in one line: the service's code and message (`QueueDoesNotExist: The
/// specified queue does not exist. (HTTP 400)`); missing credentials as what to set; anything
/// else as its chain of messages. Never the SDK's debug dump of the request and response.
pub(crate) fn describe<E>(e: &SdkError<E, aws_smithy_runtime_api::http::Response>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    if let SdkError::ServiceError(ctx) = e {
        let status = ctx.raw().status().as_u16();
        let err = ctx.err();
        return match (err.code(), err.message()) {
            (Some(code), Some(message)) => format!("{code}: {message} (HTTP {status})"),
            (Some(text), None) | (None, Some(text)) => format!("{text} (HTTP {status})"),
            (None, None) => format!("HTTP {status}"),
        };
    }
    let chain = messages(e);
    if matches!(e, SdkError::DispatchFailure(_)) && chain.contains("loading credentials") {
        return NO_CREDENTIALS.to_string();
    }
    chain
}

/// What a call without credentials says (the SDK's own text names only the last source it
/// tried, EC2 instance metadata, which reads as an outage of that).
const NO_CREDENTIALS: &str = "no AWS credentials: none of the standard sources had any; set \
    AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), or \
    AWS_PROFILE naming a profile of ~/.aws/credentials or ~/.aws/config, or run with a role \
    (web identity, ECS task role, EC2 instance profile)";

/// An error and its sources, by their messages (each once), joined with `: `.
fn messages(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// One failed entry of a batch call (its id is its index in `entries`): the id, and its error
/// naming the event.
#[cfg(any(feature = "sqs", feature = "sns"))]
pub(crate) fn failed_entry(
    entries: &[Prepared],
    what: &str,
    id: &str,
    code: &str,
    message: Option<&str>,
    sender_fault: bool,
) -> (String, PublishError) {
    let event = id
        .parse::<usize>()
        .ok()
        .and_then(|i| entries.get(i))
        .map(|p| p.event.to_string())
        .unwrap_or_default();
    (
        id.to_string(),
        entry_error(
            &format!("event {event}: {what}"),
            code,
            message,
            sender_fault,
        ),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::publish::ErrorKind;

    /// A service's refusal is its code and message; a call without credentials says what to
    /// set; nothing is a debug dump.
    #[cfg(feature = "sqs")]
    #[test]
    fn call_errors_are_one_line() {
        use aws_sdk_sqs::operation::get_queue_url::GetQueueUrlError;
        use aws_smithy_runtime_api::client::result::ConnectorError;
        use aws_smithy_runtime_api::http::{Response, StatusCode};
        use aws_smithy_types::body::SdkBody;
        use aws_smithy_types::error::ErrorMetadata;
        let raw = || {
            Response::new(
                StatusCode::try_from(400).unwrap(),
                SdkBody::from("<ErrorResponse/>"),
            )
        };
        let meta = ErrorMetadata::builder()
            .code("AWS.SimpleQueueService.NonExistentQueue")
            .message("The specified queue does not exist.")
            .build();
        let e = SdkError::service_error(GetQueueUrlError::generic(meta), raw());
        assert_eq!(
            describe(&e),
            "AWS.SimpleQueueService.NonExistentQueue: The specified queue does not exist. \
             (HTTP 400)"
        );
        let e = call_error("SQS: find queue \"q\"", &e);
        assert_eq!(e.kind(), ErrorKind::Unavailable, "a missing queue: {e}");
        let e = SdkError::<GetQueueUrlError, Response>::service_error(
            GetQueueUrlError::generic(ErrorMetadata::builder().build()),
            raw(),
        );
        assert_eq!(describe(&e), "HTTP 400");
        let loading: Box<dyn std::error::Error + Send + Sync> =
            "an error occurred while loading credentials: failed to load IMDS session token".into();
        let e = SdkError::<GetQueueUrlError, Response>::dispatch_failure(ConnectorError::other(
            loading, None,
        ));
        let text = describe(&e);
        assert!(text.starts_with("no AWS credentials"), "{text}");
        assert!(
            text.contains("AWS_ACCESS_KEY_ID") && !text.contains("IMDS"),
            "{text}"
        );
        let refused: Box<dyn std::error::Error + Send + Sync> = "connection refused".into();
        let e =
            SdkError::<GetQueueUrlError, Response>::dispatch_failure(ConnectorError::io(refused));
        let text = describe(&e);
        assert!(text.contains("connection refused"), "{text}");
        assert!(!text.contains('{'), "{text}");
    }

    #[test]
    fn entry_errors() {
        assert_eq!(
            entry_error("x", "ThrottlingException", None, true).kind(),
            ErrorKind::Transient
        );
        assert_eq!(
            entry_error("x", "InvalidParameterValue", None, true).kind(),
            ErrorKind::Permanent
        );
        assert_eq!(
            entry_error("x", "InternalError", None, false).kind(),
            ErrorKind::Transient
        );
        assert_eq!(
            entry_error("x", "KMSAccessDenied", None, true).kind(),
            ErrorKind::Unavailable
        );
        // Kinesis's per-record codes, and what a whole call may say.
        assert_eq!(
            entry_error("x", "ProvisionedThroughputExceededException", None, false).kind(),
            ErrorKind::Transient
        );
        assert_eq!(
            entry_error("x", "InternalFailure", None, false).kind(),
            ErrorKind::Transient
        );
        assert_eq!(
            entry_error("x", "ResourceNotFoundException", None, true).kind(),
            ErrorKind::Unavailable
        );
        assert_eq!(
            entry_error("x", "KMSDisabledException", None, true).kind(),
            ErrorKind::Unavailable
        );
    }
}
