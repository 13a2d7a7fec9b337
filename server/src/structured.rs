//! The request fields that constrain the output, in every spelling clients send them, mapped
//! onto one engine `Constraint`: OpenAI's `response_format` (`json_object`, `json_schema`),
//! vLLM's `structured_outputs` and `guided_json` / `guided_regex` / `guided_choice` /
//! `guided_grammar`, llama-server's `grammar` (Lark, llguidance's syntax) and `json_schema`;
//! and OpenAI's `logit_bias`. More than one constraint is a 400; so is a malformed one (the
//! engine's compiler names what it cannot compile). With a reasoning parser, a chat answer's
//! constraint starts after its reasoning (`--structured-outputs-config`'s `enable_in_reasoning`
//! puts the reasoning under it too).

use std::collections::BTreeMap;

use engine::Constraint;
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;

/// vLLM's `--structured-outputs-config` (its JSON; the fields that apply here, any other is an
/// error naming it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputsConfig {
    /// The grammar engine: `auto` or `guidance` (llguidance, the one there is).
    #[serde(default)]
    pub backend: Backend,
    /// With a reasoning parser, the constraint covers the reasoning too (the whole answer);
    /// otherwise (the default) the reasoning is free and only what follows it is constrained.
    #[serde(default)]
    pub enable_in_reasoning: bool,
}

/// `StructuredOutputsConfig::backend`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    #[default]
    Auto,
    Guidance,
}

impl StructuredOutputsConfig {
    pub fn from_json(json: &str) -> Result<Self, String> {
        serde_json::from_str(json).map_err(|e| format!("--structured-outputs-config: {e}"))
    }

    /// The constraint a chat request's output runs under: `constraint`, after the reasoning
    /// span of `parser` unless the reasoning is constrained too.
    pub(crate) fn chat_constraint(
        self,
        parser: Option<crate::ReasoningParser>,
        constraint: Constraint,
    ) -> Constraint {
        match parser {
            Some(parser) if !self.enable_in_reasoning => {
                Constraint::AfterReasoning { reasoning: parser.span(), answer: Box::new(constraint) }
            }
            _ => constraint,
        }
    }
}

/// OpenAI's `response_format`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub json_schema: Option<JsonSchemaFormat>,
}

/// `response_format.json_schema`: a name, the schema, and `strict` (always honoured: the
/// output is constrained either way).
#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    #[serde(default)]
    #[allow(dead_code)]
    pub name: Option<String>,
    #[serde(default)]
    pub schema: Option<Value>,
    #[serde(default)]
    #[allow(dead_code)]
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs` object (one of its fields set).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StructuredOutputs {
    pub json: Option<Value>,
    pub regex: Option<String>,
    pub choice: Option<Vec<String>>,
    pub grammar: Option<String>,
    pub json_object: Option<bool>,
}

/// The constraint fields of a request body (flattened into both endpoints' bodies).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConstraintFields {
    pub response_format: Option<ResponseFormat>,
    pub structured_outputs: Option<StructuredOutputs>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    /// llama-server's grammar field; llguidance's Lark syntax (GBNF does not compile).
    pub grammar: Option<String>,
    /// llama-server's schema field.
    pub json_schema: Option<Value>,
    /// Token id (as a string, OpenAI's shape) → bias in [-100, 100].
    pub logit_bias: Option<BTreeMap<String, f64>>,
}

/// A schema given as a JSON value or as a string holding one (vLLM takes both).
fn schema(value: &Value, field: &'static str) -> Result<Value, ApiError> {
    match value {
        Value::String(text) => serde_json::from_str(text)
            .map_err(|e| ApiError::bad_request(format!("{field} is not valid JSON: {e}"), Some(field))),
        other => Ok(other.clone()),
    }
}

impl ConstraintFields {
    /// The one constraint the request sets (and the field that set it), if any.
    pub fn constraint(&self) -> Result<Option<(Constraint, &'static str)>, ApiError> {
        let mut found: Vec<(Constraint, &'static str)> = Vec::new();
        if let Some(rf) = &self.response_format {
            match rf.kind.as_str() {
                "text" => {}
                "json_object" => found.push((Constraint::JsonObject, "response_format")),
                "json_schema" => {
                    let s = rf.json_schema.as_ref().and_then(|j| j.schema.as_ref()).ok_or_else(|| {
                        ApiError::bad_request(
                            "response_format of type json_schema needs json_schema.schema",
                            Some("response_format"),
                        )
                    })?;
                    found.push((Constraint::JsonSchema(schema(s, "response_format")?), "response_format"));
                }
                other => {
                    return Err(ApiError::bad_request(
                        format!(
                            "response_format type {other:?} is not one of text, json_object, json_schema"
                        ),
                        Some("response_format"),
                    ));
                }
            }
        }
        if let Some(so) = &self.structured_outputs {
            let field = "structured_outputs";
            if let Some(j) = &so.json {
                found.push((Constraint::JsonSchema(schema(j, field)?), field));
            }
            if let Some(r) = &so.regex {
                found.push((Constraint::Regex(r.clone()), field));
            }
            if let Some(c) = &so.choice {
                found.push((Constraint::Choice(c.clone()), field));
            }
            if let Some(g) = &so.grammar {
                found.push((Constraint::Lark(g.clone()), field));
            }
            if so.json_object == Some(true) {
                found.push((Constraint::JsonObject, field));
            }
        }
        if let Some(j) = &self.guided_json {
            found.push((Constraint::JsonSchema(schema(j, "guided_json")?), "guided_json"));
        }
        if let Some(j) = &self.json_schema {
            found.push((Constraint::JsonSchema(schema(j, "json_schema")?), "json_schema"));
        }
        if let Some(r) = &self.guided_regex {
            found.push((Constraint::Regex(r.clone()), "guided_regex"));
        }
        if let Some(c) = &self.guided_choice {
            found.push((Constraint::Choice(c.clone()), "guided_choice"));
        }
        if let Some(g) = &self.guided_grammar {
            found.push((Constraint::Lark(g.clone()), "guided_grammar"));
        }
        if let Some(g) = &self.grammar {
            found.push((Constraint::Lark(g.clone()), "grammar"));
        }
        if found.len() > 1 {
            let names: Vec<&str> = found.iter().map(|(_, f)| *f).collect();
            return Err(ApiError::bad_request(
                format!("at most one output constraint may be set, got {}", names.join(", ")),
                Some(found[1].1),
            ));
        }
        Ok(found.pop())
    }

    /// The field that sets the request's constraint (what a compile error names).
    pub fn constraint_field(&self) -> Option<&'static str> {
        [
            (self.response_format.as_ref().is_some_and(|r| r.kind != "text"), "response_format"),
            (self.structured_outputs.is_some(), "structured_outputs"),
            (self.guided_json.is_some(), "guided_json"),
            (self.json_schema.is_some(), "json_schema"),
            (self.guided_regex.is_some(), "guided_regex"),
            (self.guided_choice.is_some(), "guided_choice"),
            (self.guided_grammar.is_some(), "guided_grammar"),
            (self.grammar.is_some(), "grammar"),
        ]
        .into_iter()
        .find_map(|(set, name)| set.then_some(name))
    }

    /// `logit_bias` with token ids as numbers (the engine checks the range and the vocabulary).
    pub fn logit_bias(&self) -> Result<BTreeMap<u32, f32>, ApiError> {
        let Some(bias) = &self.logit_bias else { return Ok(BTreeMap::new()) };
        bias.iter()
            .map(|(k, &v)| {
                let token = k.trim().parse::<u32>().map_err(|_| {
                    ApiError::bad_request(
                        format!("logit_bias key {k:?} is not a token id"),
                        Some("logit_bias"),
                    )
                })?;
                if !v.is_finite() {
                    return Err(ApiError::bad_request(
                        "logit_bias values must be finite",
                        Some("logit_bias"),
                    ));
                }
                Ok((token, v as f32))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structured_outputs_config_reads_vllms_json() {
        let c = StructuredOutputsConfig::from_json(r#"{"enable_in_reasoning": true, "backend": "guidance"}"#);
        assert_eq!(c, Ok(StructuredOutputsConfig { backend: Backend::Guidance, enable_in_reasoning: true }));
        assert_eq!(StructuredOutputsConfig::from_json("{}"), Ok(StructuredOutputsConfig::default()));
        for (bad, named) in [
            (r#"{"backend": "xgrammar"}"#, "xgrammar"),
            (r#"{"disable_fallback": true}"#, "disable_fallback"),
        ] {
            let e = StructuredOutputsConfig::from_json(bad).unwrap_err();
            assert!(e.contains(named) && e.starts_with("--structured-outputs-config"), "{e}");
        }
    }

    fn fields(body: Value) -> ConstraintFields {
        serde_json::from_value(body).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn every_spelling_maps_onto_one_constraint() {
        let schema = serde_json::json!({"type": "object"});
        for (body, want, field) in [
            (
                serde_json::json!({"response_format": {"type": "json_object"}}),
                Constraint::JsonObject,
                "response_format",
            ),
            (
                serde_json::json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}),
                Constraint::JsonSchema(schema.clone()),
                "response_format",
            ),
            (
                serde_json::json!({"guided_json": schema.to_string()}),
                Constraint::JsonSchema(schema.clone()),
                "guided_json",
            ),
            (
                serde_json::json!({"json_schema": schema}),
                Constraint::JsonSchema(schema.clone()),
                "json_schema",
            ),
            (serde_json::json!({"guided_regex": "a+"}), Constraint::Regex("a+".into()), "guided_regex"),
            (
                serde_json::json!({"guided_choice": ["a", "b"]}),
                Constraint::Choice(vec!["a".into(), "b".into()]),
                "guided_choice",
            ),
            (
                serde_json::json!({"guided_grammar": "start: \"a\""}),
                Constraint::Lark("start: \"a\"".into()),
                "guided_grammar",
            ),
            (
                serde_json::json!({"grammar": "start: \"a\""}),
                Constraint::Lark("start: \"a\"".into()),
                "grammar",
            ),
            (
                serde_json::json!({"structured_outputs": {"choice": ["x"]}}),
                Constraint::Choice(vec!["x".into()]),
                "structured_outputs",
            ),
            (
                serde_json::json!({"structured_outputs": {"json_object": true}}),
                Constraint::JsonObject,
                "structured_outputs",
            ),
        ] {
            let got = fields(body.clone()).constraint().unwrap_or_else(|e| panic!("{body}: {e:?}"));
            assert_eq!(got, Some((want, field)), "{body}");
        }
        assert_eq!(fields(serde_json::json!({"response_format": {"type": "text"}})).constraint(), Ok(None));
    }

    #[test]
    fn conflicting_or_malformed_constraints_are_400s() {
        for (body, param) in [
            (serde_json::json!({"guided_regex": "a", "guided_choice": ["a"]}), "guided_choice"),
            (serde_json::json!({"response_format": {"type": "yaml"}}), "response_format"),
            (serde_json::json!({"response_format": {"type": "json_schema"}}), "response_format"),
            (serde_json::json!({"guided_json": "{not json"}), "guided_json"),
        ] {
            let e = fields(body.clone()).constraint().err().unwrap_or_else(|| panic!("{body} accepted"));
            assert_eq!((e.status.as_u16(), e.param), (400, Some(param)), "{body}");
        }
        let bias = fields(serde_json::json!({"logit_bias": {"12": -100, "7": 5.5}})).logit_bias();
        assert_eq!(bias, Ok(BTreeMap::from([(7, 5.5), (12, -100.0)])));
        let e = fields(serde_json::json!({"logit_bias": {"abc": 1}})).logit_bias().err();
        assert_eq!(e.and_then(|e| e.param), Some("logit_bias"));
    }
}
