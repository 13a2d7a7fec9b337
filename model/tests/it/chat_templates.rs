//! Real chat templates of the model families rendered by `ChatTemplate` against transformers'
//! renderings of the same conversations (`tests/data/chat_templates/`, made by its
//! `make_expected.py`): byte-equal text for every template × conversation, and the same
//! refusal where transformers fails.

use std::path::PathBuf;

use model::{ChatTemplate, Conversation, ModelError};
use serde::Deserialize;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat_templates")
}

#[derive(Deserialize)]
struct Tokens {
    bos_token: Option<String>,
    eos_token: Option<String>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    add_generation_prompt: bool,
    #[serde(flatten)]
    conversation: Conversation,
}

#[derive(Deserialize)]
struct Spec {
    templates: indexmap_like::Ordered<Tokens>,
    cases: Vec<Case>,
}

/// transformers' result for one template × case.
#[derive(Deserialize)]
#[serde(untagged)]
enum Expected {
    Text { text: String },
    Error { error: String, raised: bool },
}

#[derive(Deserialize)]
struct ExpectedFile {
    renders: std::collections::BTreeMap<String, std::collections::BTreeMap<String, Expected>>,
}

/// The clock `make_expected.py` pins `datetime.now()` to.
fn fixed_now() -> chrono::NaiveDateTime {
    chrono::NaiveDate::from_ymd_opt(2024, 7, 26).unwrap().and_hms_opt(9, 5, 0).unwrap()
}

/// Keeps the templates in file order for readable failure lists.
mod indexmap_like {
    use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

    pub struct Ordered<T>(pub Vec<(String, T)>);

    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Ordered<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V<T>(std::marker::PhantomData<T>);
            impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
                type Value = Ordered<T>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a map")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                    let mut out = Vec::new();
                    while let Some((k, v)) = m.next_entry()? {
                        out.push((k, v));
                    }
                    Ok(Ordered(out))
                }
            }
            d.deserialize_map(V(std::marker::PhantomData))
        }
    }
}

#[test]
fn every_family_template_renders_as_transformers_does() {
    let dir = data_dir();
    let spec: Spec = serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).unwrap()).unwrap();
    let expected: ExpectedFile =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let mut failures = Vec::new();
    let mut checked = 0;
    for (name, tokens) in &spec.templates.0 {
        let source = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
        let template = ChatTemplate::with_clock(
            &source,
            tokens.bos_token.as_deref().unwrap_or(""),
            tokens.eos_token.as_deref().unwrap_or(""),
            Some(fixed_now()),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let renders = &expected.renders[name];
        for case in &spec.cases {
            let got = template.render_conversation(&case.conversation, case.add_generation_prompt);
            checked += 1;
            let what = format!("{name} × {}", case.name);
            match (&renders[&case.name], got) {
                (Expected::Text { text }, Ok(got)) if *text == got => {}
                (Expected::Text { text }, Ok(got)) => {
                    failures.push(format!("{what}:\n want {text:?}\n got  {got:?}"))
                }
                (Expected::Text { .. }, Err(e)) => failures.push(format!("{what}: want text, got error {e}")),
                (Expected::Error { error, raised: true }, Err(ModelError::ChatTemplateRaised(msg)))
                    if *error == msg => {}
                (Expected::Error { raised: false, .. }, Err(ModelError::ChatTemplate(_))) => {}
                (Expected::Error { error, raised }, got) => {
                    failures.push(format!("{what}: want error {error:?} (raised: {raised}), got {got:?}"))
                }
            }
        }
    }
    assert_eq!(checked, 8 * 15, "every template × case is checked");
    assert!(failures.is_empty(), "{} of {checked} differ:\n{}", failures.len(), failures.join("\n"));
}
