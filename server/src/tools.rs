//! Tool calling on `/v1/chat/completions`: `tool_choice` (`none`, `auto`, `required`, a named
//! function) and `parallel_tool_calls` read into a [`ToolPlan`]; `required` and named choices
//! become a JSON-schema constraint built from the tools' parameter schemas (so the output is
//! a call whose arguments validate, whatever the model), and the finished text is parsed into
//! OpenAI `tool_calls`: the constrained shapes, or under `auto` the families' own formats
//! (Hermes/Qwen `<tool_call>…</tool_call>`, Mistral `[TOOL_CALLS][…]`, Llama 3.x JSON with
//! `name` and `parameters`, after an optional `<|python_tag|>`): whichever the text holds, or
//! only the one `--tool-call-parser` names ([`ToolCallParser`], vLLM's flag).

use engine::{Constraint, TemplateValue};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::ApiError;

/// `tool_choice` as sent: a mode string or `{"type": "function", "function": {"name": …}}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ToolChoiceInput {
    Mode(String),
    Named { function: NamedFunction },
}

#[derive(Debug, Clone, Deserialize)]
pub struct NamedFunction {
    pub name: String,
}

/// Which of the families' call formats an `auto` choice's text is read for (vLLM's
/// `--tool-call-parser`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolCallParser {
    /// Whichever format the text holds (the model's template decides what it writes).
    #[default]
    Auto,
    /// `<tool_call>{…}</tool_call>` (Hermes, Qwen).
    Hermes,
    /// A JSON object or list with `name` and `parameters`, after an optional `<|python_tag|>`
    /// (Llama 3.x).
    #[value(name = "llama3_json")]
    Llama3Json,
    /// `[TOOL_CALLS][{…}]` (Mistral).
    Mistral,
}

/// How the request's output is read for tool calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Free text or a call in the model's own format.
    Auto,
    /// At least one call (all of them one JSON array of `{name, parameters}`).
    Required,
    /// A call of this function (the output is its arguments).
    Named(String),
}

/// The request's tools as the parser needs them.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    pub choice: ToolChoice,
    pub names: Vec<String>,
    pub parser: ToolCallParser,
}

/// One parsed call: OpenAI's `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionOut,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionOut {
    pub name: String,
    /// The arguments as a JSON string (OpenAI's shape).
    pub arguments: String,
}

/// Each function tool's name and parameter schema (`{"type": "object"}` when it has none).
fn functions(tools: &[TemplateValue]) -> Result<Vec<(String, Value)>, ApiError> {
    let bad = |m: String| ApiError::bad_request(m, Some("tools"));
    tools
        .iter()
        .map(|t| {
            let t = serde_json::to_value(t).map_err(|e| bad(format!("a tool is not JSON: {e}")))?;
            let f = &t["function"];
            let name = f["name"].as_str().ok_or_else(|| bad("every tool needs function.name".into()))?;
            let params = match &f["parameters"] {
                Value::Null => json!({"type": "object"}),
                p => p.clone(),
            };
            Ok((name.to_owned(), params))
        })
        .collect()
}

/// The plan and the constraint of a request's tools: none without tools or with
/// `tool_choice: "none"`; `auto` (the default) parses without constraining.
pub fn plan(
    tools: Option<&[TemplateValue]>,
    choice: Option<&ToolChoiceInput>,
    parallel: bool,
    parser: ToolCallParser,
) -> Result<Option<(ToolPlan, Option<Constraint>)>, ApiError> {
    let param = Some("tool_choice");
    let Some(tools) = tools.filter(|t| !t.is_empty()) else {
        return match choice {
            Some(ToolChoiceInput::Mode(m)) if m == "none" || m == "auto" => Ok(None),
            None => Ok(None),
            Some(_) => Err(ApiError::bad_request("tool_choice needs tools", param)),
        };
    };
    let funcs = functions(tools)?;
    let names: Vec<String> = funcs.iter().map(|(n, _)| n.clone()).collect();
    let (choice, constraint) = match choice {
        None => (ToolChoice::Auto, None),
        Some(ToolChoiceInput::Mode(m)) => match m.as_str() {
            "none" => return Ok(None),
            "auto" => (ToolChoice::Auto, None),
            "required" => {
                let calls: Vec<Value> = funcs
                    .iter()
                    .map(|(name, params)| {
                        json!({"type": "object", "properties": {"name": {"const": name}, "parameters": params},
                               "required": ["name", "parameters"], "additionalProperties": false})
                    })
                    .collect();
                let mut schema = json!({"type": "array", "minItems": 1, "items": {"anyOf": calls}});
                if !parallel {
                    schema["maxItems"] = json!(1);
                }
                (ToolChoice::Required, Some(Constraint::JsonSchema(schema)))
            }
            other => {
                return Err(ApiError::bad_request(
                    format!("tool_choice {other:?} is not one of none, auto, required or a named function"),
                    param,
                ));
            }
        },
        Some(ToolChoiceInput::Named { function }) => {
            let params =
                funcs.iter().find(|(n, _)| *n == function.name).map(|(_, p)| p.clone()).ok_or_else(|| {
                    ApiError::bad_request(
                        format!("tool_choice names {:?}, which is not a tool", function.name),
                        param,
                    )
                })?;
            (ToolChoice::Named(function.name.clone()), Some(Constraint::JsonSchema(params)))
        }
    };
    Ok(Some((ToolPlan { choice, names, parser }, constraint)))
}

/// The text beside the calls, and each call's name and arguments.
type Calls = (Option<String>, Vec<(String, String)>);

/// A call from a JSON object with `name` and `arguments` (or `parameters`), when the name is a tool's.
fn call_of(v: &Value, names: &[String]) -> Option<(String, String)> {
    let name = v["name"].as_str()?;
    if !names.iter().any(|n| n == name) {
        return None;
    }
    let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or(json!({}));
    let args = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some((name.to_owned(), args))
}

impl ToolPlan {
    /// The calls in a finished text and the text left beside them; `None` when it holds none.
    pub fn parse(&self, text: &str, call_id: &str) -> Option<(Option<String>, Vec<ToolCallOut>)> {
        let (content, calls) = self.parse_calls(text.trim())?;
        if calls.is_empty() {
            return None;
        }
        let calls = calls
            .into_iter()
            .enumerate()
            .map(|(i, (name, arguments))| ToolCallOut {
                index: None,
                id: format!("call_{call_id}_{i}"),
                kind: "function",
                function: FunctionOut { name, arguments },
            })
            .collect();
        Some((content.filter(|c| !c.trim().is_empty()), calls))
    }

    fn parse_calls(&self, text: &str) -> Option<Calls> {
        match &self.choice {
            ToolChoice::Named(name) => {
                let args: Value = serde_json::from_str(text).ok()?;
                Some((None, vec![(name.clone(), args.to_string())]))
            }
            ToolChoice::Required => {
                let calls: Vec<Value> = serde_json::from_str(text).ok()?;
                let calls = calls.iter().map(|c| call_of(c, &self.names)).collect::<Option<Vec<_>>>()?;
                Some((None, calls))
            }
            ToolChoice::Auto => self.parse_native(text),
        }
    }

    /// The model families' own call formats (the one the parser names, or any under `Auto`).
    fn parse_native(&self, text: &str) -> Option<Calls> {
        let any = self.parser == ToolCallParser::Auto;
        if (any || self.parser == ToolCallParser::Hermes) && text.contains("<tool_call>") {
            return self.parse_hermes(text);
        }
        if (any || self.parser == ToolCallParser::Mistral)
            && let Some(i) = text.find("[TOOL_CALLS]")
        {
            let v: Value = serde_json::from_str(text[i + "[TOOL_CALLS]".len()..].trim()).ok()?;
            let list = v.as_array().cloned().unwrap_or_else(|| vec![v]);
            let calls = list.iter().map(|c| call_of(c, &self.names)).collect::<Option<Vec<_>>>()?;
            return Some((Some(text[..i].to_owned()), calls));
        }
        if !(any || self.parser == ToolCallParser::Llama3Json) {
            return None;
        }
        let body = text.strip_prefix("<|python_tag|>").unwrap_or(text).trim();
        let v: Value = serde_json::from_str(body).ok()?;
        let list = v.as_array().cloned().unwrap_or_else(|| vec![v]);
        let calls = list.iter().map(|c| call_of(c, &self.names)).collect::<Option<Vec<_>>>()?;
        Some((None, calls))
    }

    /// Hermes/Qwen: every `<tool_call>{…}</tool_call>`, the text around them kept.
    fn parse_hermes(&self, text: &str) -> Option<Calls> {
        let mut calls = Vec::new();
        let mut content = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("<tool_call>") {
            content.push_str(&rest[..start]);
            let after = &rest[start + "<tool_call>".len()..];
            let end = after.find("</tool_call>").unwrap_or(after.len());
            let v: Value = serde_json::from_str(after[..end].trim()).ok()?;
            calls.push(call_of(&v, &self.names)?);
            rest = after.get(end + "</tool_call>".len()..).unwrap_or("");
        }
        content.push_str(rest);
        Some((Some(content), calls))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<TemplateValue> {
        let t = json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "now"}}
        ]);
        serde_json::from_value(t).unwrap_or_default()
    }

    fn choice(v: Value) -> ToolChoiceInput {
        serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn choices_become_plans_and_constraints() {
        let t = tools();
        assert_eq!(plan(Some(&t), Some(&choice(json!("none"))), true, ToolCallParser::Auto).ok(), Some(None));
        assert_eq!(plan(None, None, true, ToolCallParser::Auto).ok(), Some(None));
        let (p, c) =
            plan(Some(&t), None, true, ToolCallParser::Auto).ok().flatten().unwrap_or_else(|| panic!("auto"));
        assert_eq!((p.choice, c), (ToolChoice::Auto, None));
        let named = choice(json!({"type": "function", "function": {"name": "get_weather"}}));
        let (p, c) = plan(Some(&t), Some(&named), true, ToolCallParser::Auto)
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("named"));
        assert_eq!(p.choice, ToolChoice::Named("get_weather".into()));
        assert!(matches!(c, Some(Constraint::JsonSchema(s)) if s["required"] == json!(["city"])));
        let (_, c) = plan(Some(&t), Some(&choice(json!("required"))), false, ToolCallParser::Auto)
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!());
        assert!(matches!(c, Some(Constraint::JsonSchema(s)) if s["maxItems"] == json!(1)));
        for (tools, ch) in [
            (Some(t.as_slice()), choice(json!("sometimes"))),
            (Some(t.as_slice()), choice(json!({"type": "function", "function": {"name": "nope"}}))),
            (None, choice(json!("required"))),
        ] {
            let e = plan(tools, Some(&ch), true, ToolCallParser::Auto)
                .err()
                .unwrap_or_else(|| panic!("{ch:?} accepted"));
            assert_eq!(e.param, Some("tool_choice"));
        }
    }

    #[test]
    fn every_format_parses_into_calls() {
        let names = vec!["get_weather".to_owned(), "now".to_owned()];
        let auto = ToolPlan { choice: ToolChoice::Auto, names: names.clone(), parser: ToolCallParser::Auto };
        let hermes = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (content, calls) = auto.parse(hermes, "x").unwrap_or_else(|| panic!("hermes"));
        assert_eq!(content.as_deref().map(str::trim), Some("Sure."));
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(calls[0].function.arguments, r#"{"city":"Paris"}"#);
        assert_eq!(calls[0].id, "call_x_0");
        let mistral = r#"[TOOL_CALLS][{"name": "now", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Lima"}}]"#;
        assert_eq!(auto.parse(mistral, "y").map(|(_, c)| c.len()), Some(2));
        let llama = r#"<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}"#;
        assert_eq!(
            auto.parse(llama, "z").map(|(_, c)| c[0].function.arguments.clone()),
            Some(r#"{"city":"Oslo"}"#.into())
        );
        assert_eq!(auto.parse("Just text.", "t"), None);
        assert_eq!(auto.parse(r#"{"name": "unknown_tool", "parameters": {}}"#, "t"), None);
        let required =
            ToolPlan { choice: ToolChoice::Required, names: names.clone(), parser: ToolCallParser::Auto };
        let out = required.parse(r#"[{"name": "now", "parameters": {}}]"#, "r");
        assert_eq!(out.map(|(c, calls)| (c, calls[0].function.name.clone())), Some((None, "now".into())));
        let named =
            ToolPlan { choice: ToolChoice::Named("get_weather".into()), names, parser: ToolCallParser::Auto };
        let out = named.parse(r#"{"city": "Rome"}"#, "n").unwrap_or_else(|| panic!("named"));
        assert_eq!(out.1[0].function.arguments, r#"{"city":"Rome"}"#);
    }

    #[test]
    fn a_forced_parser_reads_only_its_own_format() {
        let names = vec!["get_weather".to_owned(), "now".to_owned()];
        let with = |parser| ToolPlan { choice: ToolChoice::Auto, names: names.clone(), parser };
        let hermes = "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
        let mistral = r#"[TOOL_CALLS][{"name": "now", "arguments": {}}]"#;
        let llama = r#"{"name": "now", "parameters": {}}"#;
        for (parser, reads) in [
            (ToolCallParser::Auto, [true, true, true]),
            (ToolCallParser::Hermes, [true, false, false]),
            (ToolCallParser::Mistral, [false, true, false]),
            (ToolCallParser::Llama3Json, [false, false, true]),
        ] {
            let got = [hermes, mistral, llama].map(|text| with(parser).parse(text, "c").is_some());
            assert_eq!(got, reads, "{parser:?}");
        }
    }
}
