use super::Message;

/// A destination template such as `outbox.{aggregate_type}.{event_type}`.
///
/// Placeholders: `{aggregate_type}`, `{aggregate_id}`, `{event_type}`, `{id}`. Unknown
/// placeholders and unbalanced braces are rejected when the template is parsed, so a typo
/// stops start-up instead of misrouting events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    AggregateType,
    AggregateId,
    EventType,
    Id,
}

/// A destination template was refused: an unknown placeholder, an unbalanced brace, or an empty
/// template. The message quotes the template.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("template {template:?}: {reason}")]
pub struct TemplateError {
    template: String,
    reason: String,
}

impl Template {
    /// Parse and check `source`; every error is found here, so rendering cannot fail.
    pub fn parse(source: &str) -> Result<Self, TemplateError> {
        let err = |reason: String| TemplateError {
            template: source.to_string(),
            reason,
        };
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut rest = source;
        while let Some(i) = rest.find(['{', '}']) {
            if rest.as_bytes()[i] == b'}' {
                return Err(err("unmatched `}`".into()));
            }
            lit.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            let end = after.find('}').ok_or_else(|| err("unclosed `{`".into()))?;
            let name = &after[..end];
            let part = match name {
                "aggregate_type" => Part::AggregateType,
                "aggregate_id" => Part::AggregateId,
                "event_type" => Part::EventType,
                "id" => Part::Id,
                other => {
                    return Err(err(format!(
                        "unknown placeholder `{{{other}}}` (known: {{aggregate_type}}, {{aggregate_id}}, {{event_type}}, {{id}})"
                    )))
                }
            };
            if !lit.is_empty() {
                parts.push(Part::Lit(std::mem::take(&mut lit)));
            }
            parts.push(part);
            rest = &after[end + 1..];
        }
        lit.push_str(rest);
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        if parts.is_empty() {
            return Err(err("is empty".into()));
        }
        Ok(Self {
            source: source.to_string(),
            parts,
        })
    }

    /// The template as it was written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Fill the template from one message.
    pub fn render(&self, m: &Message) -> String {
        let mut out = String::with_capacity(self.source.len() + 32);
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::AggregateType => out.push_str(&m.aggregate_type),
                Part::AggregateId => out.push_str(&m.aggregate_id),
                Part::EventType => out.push_str(&m.event_type),
                Part::Id => out.push_str(&m.id.to_string()),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg() -> Message {
        Message {
            id: uuid::Uuid::nil(),
            seq: 1,
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "order.created".into(),
            body: b"{}".to_vec(),
            content_type: "application/json".into(),
            headers: Default::default(),
            created_at: chrono::Utc::now(),
            attempt: 1,
        }
    }

    #[test]
    fn renders_placeholders() {
        let t = Template::parse("outbox.{aggregate_type}.{event_type}").unwrap();
        assert_eq!(t.render(&msg()), "outbox.order.order.created");
        let t = Template::parse("{aggregate_id}").unwrap();
        assert_eq!(t.render(&msg()), "42");
        let t = Template::parse("plain").unwrap();
        assert_eq!(t.render(&msg()), "plain");
    }

    #[test]
    fn rejects_bad_templates() {
        for bad in ["", "a.{nope}", "a.{event_type", "a}", "{}"] {
            assert!(Template::parse(bad).is_err(), "{bad:?} should be refused");
        }
        let e = Template::parse("x.{evnt_type}").unwrap_err().to_string();
        assert!(e.contains("evnt_type"), "{e}");
    }
}
