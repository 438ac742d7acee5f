//! Unit tests of secret redaction: URLs, settings in free text, client libraries' echoes.

use super::*;

#[test]
fn redacts_passwords() {
    assert_eq!(
        redact_url("amqp://guest:secret@127.0.0.1:5672/%2f"),
        "amqp://guest:***@127.0.0.1:5672/%2f"
    );
    assert_eq!(redact_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
    // A NATS user name without a password is a token.
    assert_eq!(
        redact_url("nats://t0ken@127.0.0.1:4222"),
        "nats://***@127.0.0.1:4222"
    );
    assert_eq!(
        redact_url("tls://t0ken@127.0.0.1:4222?tls_ca=/ca.pem"),
        "tls://***@127.0.0.1:4222?tls_ca=/ca.pem"
    );
    assert_eq!(redact_url("redis://app@h:6379"), "redis://app@h:6379");
    let bad = redact_url("amqp://u:s3cret@[bad:host/x");
    assert!(!bad.contains("s3cret"), "{bad}");
}

#[test]
fn redacts_secret_query_parameters() {
    for (raw, want) in [
        (
            "kafka://u:pw@h:9092?topic=t&sasl_password=s3c&linger_ms=5",
            "kafka://u:***@h:9092?topic=t&sasl_password=***&linger_ms=5",
        ),
        (
            "kafka://h?ssl_key_password=s3c&ssl.key.password=s3c&sasl.password=s3c",
            "kafka://h?ssl_key_password=***&ssl.key.password=***&sasl.password=***",
        ),
        (
            "postgres://app@db:5432/x?sslmode=require&password=s3c",
            "postgres://app@db:5432/x?sslmode=require&password=***",
        ),
        (
            "postgres://db/x?user=app&sslpassword=s3c&application_name=txo",
            "postgres://db/x?user=app&sslpassword=***&application_name=txo",
        ),
        (
            "https://hooks.example/in?token=s3c&event={event_type}",
            "https://hooks.example/in?token=***&event={event_type}",
        ),
        (
            "https://h/x?Secret=s3c&API_KEY=s3c&api-key=s3c&apikey=s3c&key=s3c&sig=s3c",
            "https://h/x?Secret=***&API_KEY=***&api-key=***&apikey=***&key=***&sig=***",
        ),
        (
            "https://h/x?X-Amz-Signature=s3c&X-Amz-Credential=s3c&access_key=s3c&secret_key=s3c",
            "https://h/x?X-Amz-Signature=***&X-Amz-Credential=***&access_key=***&secret_key=***",
        ),
        (
            "mqtt://h?auth=s3c&authorization=s3c&credentials=s3c&passwd=s3c&pass=s3c",
            "mqtt://h?auth=***&authorization=***&credentials=***&passwd=***&pass=***",
        ),
        (
            "https://h/x?sasl%5Fpassword=s3c&secret=&token=a%26b",
            "https://h/x?sasl%5Fpassword=***&secret=&token=***",
        ),
        // Where a secret is kept is not a secret; nor are ordinary parameters.
        (
            "https://h/x?secret_file=/run/s&tls_key=/k.pem&ssl_key_location=/k&topic=a.b",
            "https://h/x?secret_file=/run/s&tls_key=/k.pem&ssl_key_location=/k&topic=a.b",
        ),
        ("nats://h:4222?stream=S", "nats://h:4222?stream=S"),
    ] {
        let got = redact_url(raw);
        assert_eq!(got, want, "{raw}");
        assert!(!got.contains("s3c"), "{got}");
        // Still a URL, with the other parameters intact.
        let u = url::Url::parse(&got).unwrap();
        let orig = url::Url::parse(raw).unwrap();
        assert_eq!(u.host_str(), orig.host_str(), "{raw}");
        for (k, v) in orig.query_pairs() {
            if !is_secret_param(&k) {
                assert!(
                    u.query_pairs().any(|(k2, v2)| k2 == k && v2 == v),
                    "{k} lost: {got}"
                );
            }
        }
    }
    // Unparsable URLs too.
    for bad in [
        "kafka://u:s3c@[bad:host?sasl_password=s3c",
        "https://[bad?token=s3c#frag",
        "amqp://u:s3c/x@h",
    ] {
        let got = redact_url(bad);
        assert!(!got.contains("s3c"), "{bad} -> {got}");
    }
}

#[test]
fn secret_names() {
    for n in [
        "password",
        "PASSWORD",
        "sasl.password",
        "sasl_password",
        "ssl-key-password",
        "sslpassword",
        "token",
        "auth_token",
        "access_token",
        "secret",
        "client_secret",
        "sasl.oauthbearer.client.secret",
        "api_key",
        "X-Api-Key",
        "apikey",
        "access_key",
        "secret_key",
        "key_password",
        "auth",
        "Authorization",
        "signature",
        "credentials",
        "passwd",
        "pass",
        "private_key",
        "passphrase",
    ] {
        assert!(is_secret_name(n), "{n}");
    }
    for n in [
        "topic",
        "stream",
        "user",
        "username",
        "sslmode",
        "secret_file",
        "tls_key",
        "ssl.key.location",
        "linger.ms",
        "authentication",
        "author",
        "passive",
        "key",
        "compression",
        "",
    ] {
        assert!(!is_secret_name(n), "{n}");
    }
}

#[test]
fn redacts_secrets_inside_any_text() {
    for (text, want) in [
        (
            "Kafka at kafka://u:s3c@h:9092?sasl_password=s3c&topic=t: fetch metadata: timed out",
            "Kafka at kafka://u:***@h:9092?sasl_password=***&topic=t: fetch metadata: timed out",
        ),
        (
            "cannot connect to \"postgres://app:s3c@db/x?password=s3c\", giving up",
            "cannot connect to \"postgres://app:***@db/x?password=***\", giving up",
        ),
        ("(https://h/in?api_key=s3c).", "(https://h/in?api_key=***)."),
        (
            "config sasl.password=s3c ssl.key.password=\"s 3c\" linger.ms=5, token='s3c'",
            "config sasl.password=*** ssl.key.password=\"***\" linger.ms=5, token='***'",
        ),
        (
            "Client config error: Invalid value sasl.password s3c s3c",
            "Client config error: Invalid value sasl.password ***",
        ),
        ("nats://t0k@h:4222 refused", "nats://***@h:4222 refused"),
        // TOML's spelling, as a parser's error quotes the line.
        (
            "2 | admin_token = \"s3c\n  |   ^",
            "2 | admin_token = \"***\n  |   ^",
        ),
        (
            "password =  s3c, api_key\t= 's3c' next",
            "password =  ***, api_key\t= '***' next",
        ),
    ] {
        assert_eq!(redact_secrets(text), want, "{text}");
    }
    // Text without secrets comes back as it was, URLs and all.
    for text in [
        "connection refused (os error 111)",
        "HTTP 503 from https://h/in?event=a.b: retry-after=5 code=503",
        "amqp://guest@127.0.0.1:5672/%2f: no route; a==b, =x, password authentication failed",
        "see http://h",
        "://nothing",
        "",
    ] {
        assert_eq!(redact_secrets(text), text);
    }
}
