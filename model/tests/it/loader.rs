//! Loading HF folders: bf16/f16/f32 and sharded checkpoints load to the same f32 weights, and
//! every malformed input gives an error that names the file (and tensor) at fault.

use std::collections::HashMap;

use model::{Llama, ModelError};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

use crate::tiny::{tiny_config, tiny_tensors, write_tiny_model};

fn write(dtype: Dtype, tensors: &[(String, Vec<usize>)], config: &serde_json::Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_model(dir.path(), config, tensors, dtype, 11);
    dir
}

fn default_config() -> serde_json::Value {
    tiny_config(true, serde_json::Value::Null)
}

fn load_err(dir: &tempfile::TempDir) -> String {
    match Llama::load(dir.path()) {
        Ok(_) => panic!("loading should fail"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn half_precision_weights_load_as_their_f32_values() {
    let f32_model = Llama::load(write(Dtype::F32, &tiny_tensors(true), &default_config()).path()).unwrap();
    for dtype in [Dtype::BF16, Dtype::F16] {
        let m = Llama::load(write(dtype, &tiny_tensors(true), &default_config()).path()).unwrap();
        for (a, b) in m.embed.iter().zip(&f32_model.embed) {
            let rounded = match dtype {
                Dtype::BF16 => half::bf16::from_f32(*b).to_f32(),
                _ => half::f16::from_f32(*b).to_f32(),
            };
            assert_eq!(*a, rounded);
        }
    }
}

#[test]
fn sharded_checkpoint_loads_like_a_single_file() {
    let single = write(Dtype::F32, &tiny_tensors(true), &default_config());
    let whole = std::fs::read(single.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&whole).unwrap();
    let names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
    let dir = tempfile::tempdir().unwrap();
    let mut weight_map = serde_json::Map::new();
    for (shard, part) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", shard + 1);
        let views: HashMap<String, TensorView<'_>> =
            part.iter().map(|n| (n.clone(), st.tensor(n).unwrap())).collect();
        safetensors::serialize_to_file(views, None, &dir.path().join(&file)).unwrap();
        for n in part {
            weight_map.insert(n.clone(), serde_json::json!(file));
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    std::fs::write(dir.path().join("config.json"), default_config().to_string()).unwrap();
    let a = Llama::load(single.path()).unwrap();
    let b = Llama::load(dir.path()).unwrap();
    assert_eq!(a.embed, b.embed);
    assert_eq!(a.layers[1].gate_up, b.layers[1].gate_up);
    assert_eq!(a.final_norm, b.final_norm);
}

#[test]
fn missing_tensor_names_file_and_tensor() {
    let mut tensors = tiny_tensors(true);
    tensors.retain(|(n, _)| n != "model.layers.1.mlp.up_proj.weight");
    let msg = load_err(&write(Dtype::F32, &tensors, &default_config()));
    assert!(
        msg.contains("model.safetensors")
            && msg.contains("missing tensor `model.layers.1.mlp.up_proj.weight`"),
        "{msg}"
    );
}

#[test]
fn untied_model_without_lm_head_is_a_missing_tensor() {
    let msg = load_err(&write(Dtype::F32, &tiny_tensors(true), &tiny_config(false, serde_json::Value::Null)));
    assert!(msg.contains("missing tensor `lm_head.weight`"), "{msg}");
}

#[test]
fn wrong_shape_names_tensor_and_shapes() {
    let mut tensors = tiny_tensors(true);
    for (n, s) in &mut tensors {
        if n == "model.layers.0.self_attn.k_proj.weight" {
            *s = vec![64, 96];
        }
    }
    let msg = load_err(&write(Dtype::F32, &tensors, &default_config()));
    assert!(
        msg.contains("model.safetensors")
            && msg
                .contains("`model.layers.0.self_attn.k_proj.weight` has shape [64, 96], expected [128, 96]"),
        "{msg}"
    );
}

#[test]
fn truncated_file_is_reported() {
    let dir = write(Dtype::F32, &tiny_tensors(true), &default_config());
    let path = dir.path().join("model.safetensors");
    let len = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len - 1000).unwrap();
    let msg = load_err(&dir);
    assert!(msg.contains("model.safetensors") && msg.contains("truncated or corrupt"), "{msg}");
}

#[test]
fn unsupported_architecture_is_reported() {
    let mut cfg = default_config();
    cfg["architectures"] = serde_json::json!(["GPT2LMHeadModel"]);
    cfg["model_type"] = serde_json::json!("gpt2");
    let msg = load_err(&write(Dtype::F32, &tiny_tensors(true), &cfg));
    assert!(
        msg.contains("config.json") && msg.contains("unsupported architecture \"GPT2LMHeadModel\""),
        "{msg}"
    );
}

#[test]
fn malformed_configs_are_reported() {
    let mut missing = default_config();
    missing.as_object_mut().unwrap().remove("hidden_size");
    let msg = load_err(&write(Dtype::F32, &tiny_tensors(true), &missing));
    assert!(msg.contains("config.json: malformed config") && msg.contains("hidden_size"), "{msg}");

    let dir = write(Dtype::F32, &tiny_tensors(true), &default_config());
    std::fs::write(dir.path().join("config.json"), "{\"hidden_size\": 96,").unwrap();
    let msg = load_err(&dir);
    assert!(msg.contains("config.json: malformed config"), "{msg}");
}

#[test]
fn unsupported_dtype_is_reported() {
    let dir = write(Dtype::F32, &tiny_tensors(true), &default_config());
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let ints = vec![0u8; 96 * 4];
    let mut views: HashMap<String, TensorView<'_>> =
        st.names().into_iter().map(|n| (n.to_owned(), st.tensor(n).unwrap())).collect();
    views.insert("model.norm.weight".into(), TensorView::new(Dtype::I32, vec![96], &ints).unwrap());
    let out = dir.path().join("model2.safetensors");
    safetensors::serialize_to_file(views, None, &out).unwrap();
    drop(st);
    std::fs::rename(&out, &path).unwrap();
    let Err(err) = Llama::load(dir.path()) else { panic!("loading should fail") };
    assert!(matches!(err, ModelError::UnsupportedDtype { .. }), "{err}");
    assert!(err.to_string().contains("`model.norm.weight` has unsupported dtype I32"), "{err}");
}
