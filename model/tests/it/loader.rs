//! Loading HF folders: bf16/f16/f32 and sharded checkpoints load to the same f32 weights, and
//! every malformed input gives an error that names the file (and tensor) at fault.

use std::collections::HashMap;

use model::arch::LayerMatrix;
use model::{Model, ModelError};
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
    match Model::load(dir.path()) {
        Ok(_) => panic!("loading should fail"),
        Err(e) => e.to_string(),
    }
}

/// bf16/f16 checkpoints stay in their format (two bytes a weight, no f32 copy) and compute as
/// their f32 values.
#[test]
fn half_precision_weights_load_as_their_f32_values() {
    let f32_model = Model::load(write(Dtype::F32, &tiny_tensors(true), &default_config()).path()).unwrap();
    for dtype in [Dtype::BF16, Dtype::F16] {
        let m = Model::load(write(dtype, &tiny_tensors(true), &default_config()).path()).unwrap();
        for (a, b) in m.embed.to_f32().iter().zip(&f32_model.embed.to_f32()) {
            let rounded = match dtype {
                Dtype::BF16 => half::bf16::from_f32(*b).to_f32(),
                _ => half::f16::from_f32(*b).to_f32(),
            };
            assert_eq!(*a, rounded);
        }
        let want = match dtype {
            Dtype::BF16 => quant_kernels::ggml::GgmlType::BF16,
            _ => quant_kernels::ggml::GgmlType::F16,
        };
        for w in std::iter::once(&m.embed).chain(LayerMatrix::ALL.map(|x| m.layers[0].matrix(x))) {
            assert!(w.parts().iter().all(|p| p.format() == want), "{dtype:?} kept as {want:?}");
            assert_eq!(w.storage_bytes(), 2 * w.len());
        }
    }
}

/// The tiny model split into two shards inside `root/model`; `rename` picks each shard's name
/// in the index (and where it is written, relative to the folder), and `edit` may then change
/// the index's `weight_map`.
fn sharded(
    root: &std::path::Path,
    rename: impl Fn(usize) -> String,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> std::path::PathBuf {
    let single = write(Dtype::F32, &tiny_tensors(true), &default_config());
    let whole = std::fs::read(single.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&whole).unwrap();
    let names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
    let dir = root.join("model");
    std::fs::create_dir_all(&dir).unwrap();
    let mut weight_map = serde_json::Map::new();
    for (shard, part) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let file = rename(shard);
        let views: HashMap<String, TensorView<'_>> =
            part.iter().map(|n| (n.clone(), st.tensor(n).unwrap())).collect();
        let path = dir.join(&file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        safetensors::serialize_to_file(views, None, &path).unwrap();
        for n in part {
            weight_map.insert(n.clone(), serde_json::json!(file));
        }
    }
    edit(&mut weight_map);
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    std::fs::write(dir.join("config.json"), default_config().to_string()).unwrap();
    dir
}

fn shard_name(i: usize) -> String {
    format!("model-0000{}-of-00002.safetensors", i + 1)
}

fn load_err_at(dir: &std::path::Path) -> String {
    match Model::load(dir) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn sharded_checkpoint_loads_like_a_single_file() {
    let single = write(Dtype::F32, &tiny_tensors(true), &default_config());
    let root = tempfile::tempdir().unwrap();
    let dir = sharded(root.path(), shard_name, |_| {});
    let a = Model::load(single.path()).unwrap();
    let b = Model::load(&dir).unwrap();
    assert_eq!(a.embed.to_f32(), b.embed.to_f32());
    assert_eq!(
        a.layers[1].matrix(LayerMatrix::GateUp).to_f32(),
        b.layers[1].matrix(LayerMatrix::GateUp).to_f32()
    );
    assert_eq!(a.final_norm.to_f32(), b.final_norm.to_f32());
}

#[test]
fn shard_names_may_not_leave_the_model_folder() {
    // The second shard really exists outside the folder: loading it would succeed.
    let root = tempfile::tempdir().unwrap();
    let outside = |i: usize| if i == 0 { shard_name(0) } else { "../other/model.safetensors".to_owned() };
    let dir = sharded(root.path(), outside, |_| {});
    assert!(root.path().join("other/model.safetensors").exists());
    let err = load_err_at(&dir);
    assert!(err.contains("../other/model.safetensors") && err.contains("inside the model folder"), "{err}");
    // Absolute names too (the index names the file by its full path).
    let root = tempfile::tempdir().unwrap();
    let abs_root = root.path().to_path_buf();
    let dir = sharded(root.path(), shard_name, |map| {
        for v in map.values_mut() {
            if v.as_str() == Some(shard_name(1).as_str()) {
                *v = serde_json::json!(abs_root.join("model").join(shard_name(1)).to_string_lossy());
            }
        }
    });
    let err = load_err_at(&dir);
    assert!(err.contains("inside the model folder"), "{err}");
    // Subfolders inside the model folder are fine.
    let root = tempfile::tempdir().unwrap();
    let dir = sharded(root.path(), |i| format!("shards/{}", shard_name(i)), |_| {});
    assert!(Model::load(&dir).is_ok());
}

#[test]
fn the_index_and_the_shards_must_agree() {
    let root = tempfile::tempdir().unwrap();
    // A tensor the shards hold but the index leaves out.
    let dir = sharded(root.path(), shard_name, |map| {
        map.remove("model.norm.weight");
    });
    let err = load_err_at(&dir);
    assert!(err.contains("model.norm.weight") && err.contains("does not list"), "{err}");
    // A tensor filed under the wrong shard.
    let root = tempfile::tempdir().unwrap();
    let dir = sharded(root.path(), shard_name, |map| {
        let first =
            map.iter().find(|(_, v)| v.as_str() == Some(shard_name(0).as_str())).map(|(k, _)| k.clone());
        map.insert(first.unwrap(), serde_json::json!(shard_name(1)));
    });
    let err = load_err_at(&dir);
    assert!(err.contains("weight_map puts"), "{err}");
    // A tensor the index lists that no shard holds.
    let root = tempfile::tempdir().unwrap();
    let dir = sharded(root.path(), shard_name, |map| {
        map.insert("model.extra.weight".into(), serde_json::json!(shard_name(0)));
    });
    let err = load_err_at(&dir);
    assert!(err.contains("model.extra.weight") && err.contains("does not hold"), "{err}");
}

#[test]
fn absurd_config_sizes_are_errors_not_crashes() {
    for (field, value) in [
        ("head_dim", serde_json::json!(1u64 << 60)),
        ("vocab_size", serde_json::json!(1u64 << 62)),
        ("num_hidden_layers", serde_json::json!(1_000_000_000_000u64)),
        ("intermediate_size", serde_json::json!(1u64 << 40)),
        ("max_position_embeddings", serde_json::json!(u64::MAX)),
    ] {
        let dir = write(Dtype::F32, &tiny_tensors(true), &default_config());
        let mut config = default_config();
        config[field] = value;
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        match Model::load(dir.path()) {
            // A huge max_position_embeddings is legal by itself; it only caps max_model_len.
            Ok(_) => assert_eq!(field, "max_position_embeddings"),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("config.json") || e.contains("model.safetensors"), "{field}: {e}");
            }
        }
    }
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
    let Err(err) = Model::load(dir.path()) else { panic!("loading should fail") };
    assert!(matches!(err, ModelError::UnsupportedDtype { .. }), "{err}");
    assert!(err.to_string().contains("`model.norm.weight` has unsupported dtype I32"), "{err}");
}

/// The real GGUF with one metadata value changed, or cut short: a typed error from the native
/// loader (and from the folder view of it), never a panic.
#[test]
fn a_gguf_with_inconsistent_metadata_or_cut_short_is_refused() {
    let src = model::testing::smollm2_gguf();
    assert!(src.exists(), "{} missing: run `cargo xtask fetch-model`", src.display());
    let bytes = std::fs::read(&src).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // `llama.feed_forward_length` (a u32 after its key and type tag) from 1536 to 1535: every
    // FFN tensor's shape now disagrees with the metadata.
    let key = b"llama.feed_forward_length";
    let at = bytes.windows(key.len()).position(|w| w == key).expect("key present") + key.len();
    assert_eq!(u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()), 4, "u32 type tag");
    let mut patched = bytes.clone();
    patched[at + 4..at + 8].copy_from_slice(&1535u32.to_le_bytes());
    let path = dir.path().join("patched.gguf");
    std::fs::write(&path, &patched).unwrap();
    let err = Model::load(&path).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("ffn_gate.weight") && err.contains("1535"), "{err}");
    // Cut inside the tensor data: the directory promises bytes the file does not have.
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    for result in [Model::load(&cut).err(), model::ModelFolder::open(&cut).err()] {
        let err = result.map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("truncated"), "{err}");
    }
}

/// A load reports the checkpoint's bytes as they are read, up to the file's size, then each
/// tensor as the model is built, up to every tensor the file holds: for the real GGUF and for a
/// folder of safetensors.
#[test]
fn a_load_reports_the_checkpoints_bytes_then_each_of_its_tensors() {
    use model::LoadProgress::{Bytes, Tensors};
    let folder = tempfile::tempdir().unwrap();
    model::testing::write_tiny_llama(folder.path(), 7);
    let st_file = folder.path().join("model.safetensors");
    let st_bytes = std::fs::read(&st_file).unwrap();
    let st_tensors = safetensors::SafeTensors::deserialize(&st_bytes).unwrap().len();
    let gguf = model::testing::smollm2_gguf();
    let gguf_tensors = model::gguf::GgufFile::open(&gguf).unwrap().tensors.len();
    let cases = [
        (folder.path().to_path_buf(), st_bytes.len() as u64, st_tensors),
        (gguf.clone(), std::fs::metadata(&gguf).unwrap().len(), gguf_tensors),
    ];
    for (path, file_bytes, file_tensors) in cases {
        let mut steps = Vec::new();
        model::ModelFolder::open_with_weights_reporting(&path, &mut |s| steps.push(s)).unwrap();
        let bytes: Vec<_> = steps
            .iter()
            .map_while(|s| if let Bytes { done, total } = s { Some((*done, *total)) } else { None })
            .collect();
        let tensors: Vec<_> = steps[bytes.len()..]
            .iter()
            .map(|s| match s {
                Tensors { done, total } => (*done, *total),
                Bytes { .. } => panic!("{}: bytes reported after tensors: {steps:?}", path.display()),
            })
            .collect();
        assert!(bytes.windows(2).all(|w| w[0].0 <= w[1].0), "{}: {bytes:?}", path.display());
        assert_eq!(bytes.first(), Some(&(0, file_bytes)), "{}", path.display());
        assert_eq!(bytes.last(), Some(&(file_bytes, file_bytes)), "{}", path.display());
        assert!(tensors.windows(2).all(|w| w[0].0 < w[1].0), "{}: {tensors:?}", path.display());
        assert_eq!(tensors.last(), Some(&(file_tensors, file_tensors)), "{}", path.display());
    }
}
