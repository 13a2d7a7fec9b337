//! The msgpack layout of a `KVEventBatch`, as vLLM's documented subscriber decodes it
//! (`msgspec` structs with `array_like=True`, events tagged by class name):
//!
//! ```text
//! batch          = [ts: float64, events: [event, ...]]
//! BlockStored    = ["BlockStored", block_hashes: [uint], parent_block_hash: uint | nil,
//!                   token_ids: [uint], block_size: uint, lora_id: uint | nil, medium: str]
//! BlockRemoved   = ["BlockRemoved", block_hashes: [uint], medium: str]
//! AllBlocksCleared = ["AllBlocksCleared"]
//! ```

use block_alloc::CacheEvent;
use rmp::encode::{self, ValueWriteError};

/// Where the blocks of an event live: vLLM's `medium`, `"GPU"` for the device pool (whatever
/// the device is) and `"CPU"` for the host swap space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    /// The device's KV cache.
    Gpu,
    /// The host swap space.
    Cpu,
}

impl Medium {
    /// vLLM's string for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
        }
    }
}

/// One step's events, oldest first, each with the medium of its blocks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvEventBatch {
    /// Seconds since the Unix epoch when the step ended.
    pub ts: f64,
    /// The step's events in the order they happened.
    pub events: Vec<(Medium, CacheEvent)>,
}

impl KvEventBatch {
    /// The batch in msgpack (see the module); `block_size` is the pool's tokens per block.
    pub fn encode(&self, block_size: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.events.len() * 32);
        // Writing into a Vec cannot fail.
        self.write(&mut out, block_size).unwrap_or_else(|e| unreachable!("msgpack into a Vec: {e}"));
        out
    }

    fn write(&self, out: &mut Vec<u8>, block_size: usize) -> Result<(), ValueWriteError> {
        encode::write_array_len(out, 2)?;
        encode::write_f64(out, self.ts)?;
        encode::write_array_len(out, len32(self.events.len()))?;
        for (medium, event) in &self.events {
            write_event(out, *medium, event, block_size)?;
        }
        Ok(())
    }
}

fn write_event(
    out: &mut Vec<u8>,
    medium: Medium,
    event: &CacheEvent,
    block_size: usize,
) -> Result<(), ValueWriteError> {
    match event {
        CacheEvent::Stored { block_hashes, parent_block_hash, token_ids, lora_id } => {
            encode::write_array_len(out, 7)?;
            encode::write_str(out, "BlockStored")?;
            write_uints(out, block_hashes.iter().copied())?;
            write_opt(out, *parent_block_hash)?;
            write_uints(out, token_ids.iter().map(|&t| u64::from(t)))?;
            encode::write_uint(out, block_size as u64)?;
            write_opt(out, lora_id.map(u64::from))?;
            encode::write_str(out, medium.as_str())?;
        }
        CacheEvent::Removed { block_hashes } => {
            encode::write_array_len(out, 3)?;
            encode::write_str(out, "BlockRemoved")?;
            write_uints(out, block_hashes.iter().copied())?;
            encode::write_str(out, medium.as_str())?;
        }
        CacheEvent::Cleared => {
            encode::write_array_len(out, 1)?;
            encode::write_str(out, "AllBlocksCleared")?;
        }
    }
    Ok(())
}

fn write_uints(out: &mut Vec<u8>, values: impl ExactSizeIterator<Item = u64>) -> Result<(), ValueWriteError> {
    encode::write_array_len(out, len32(values.len()))?;
    for v in values {
        encode::write_uint(out, v)?;
    }
    Ok(())
}

fn write_opt(out: &mut Vec<u8>, value: Option<u64>) -> Result<(), ValueWriteError> {
    match value {
        Some(v) => encode::write_uint(out, v).map(drop),
        None => encode::write_nil(out).map_err(ValueWriteError::InvalidMarkerWrite),
    }
}

/// msgpack arrays hold at most `u32::MAX` items; a step's events are far fewer (the pool has
/// fewer blocks than that, `BlockPool::new` checks).
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or_else(|_| unreachable!("{n} items in one msgpack array"))
}

#[cfg(test)]
mod tests {
    use rmpv::Value;

    use super::*;

    #[test]
    fn a_batch_decodes_to_vllms_array_like_tagged_layout() {
        let batch = KvEventBatch {
            ts: 1.5,
            events: vec![
                (
                    Medium::Gpu,
                    CacheEvent::Stored {
                        block_hashes: vec![u64::MAX, 7],
                        parent_block_hash: None,
                        token_ids: vec![1, 2, 3, 4],
                        lora_id: Some(3),
                    },
                ),
                (Medium::Cpu, CacheEvent::Removed { block_hashes: vec![9] }),
                (Medium::Gpu, CacheEvent::Cleared),
            ],
        };
        let bytes = batch.encode(2);
        let value = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap();
        let uints = |v: &[u64]| Value::Array(v.iter().map(|&x| Value::from(x)).collect());
        let want = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                Value::Array(vec![
                    Value::from("BlockStored"),
                    uints(&[u64::MAX, 7]),
                    Value::Nil,
                    uints(&[1, 2, 3, 4]),
                    Value::from(2u64),
                    Value::from(3u64),
                    Value::from("GPU"),
                ]),
                Value::Array(vec![Value::from("BlockRemoved"), uints(&[9]), Value::from("CPU")]),
                Value::Array(vec![Value::from("AllBlocksCleared")]),
            ]),
        ]);
        assert_eq!(value, want);
    }
}
