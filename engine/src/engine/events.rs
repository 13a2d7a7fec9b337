//! KV cache events: the changes of the device prefix cache and of what the host swap space
//! holds, one batch per step that changed either, handed to the publisher of
//! `EngineConfig::kv_events` (vLLM's `--kv-events-config`).

use block_alloc::CacheEvent;
use kv_events::{KvEventBatch, KvEventPublisher, KvEventsConfig, Medium};
use scheduler::Scheduler;

use super::Engine;
use crate::error::EngineError;

/// The running publisher and the buffers a step's events are gathered in.
#[derive(Debug)]
pub(crate) struct KvEvents {
    publisher: KvEventPublisher,
    device: Vec<CacheEvent>,
    host: Vec<CacheEvent>,
}

impl KvEvents {
    /// Starts the publisher `cfg` asks for (`None` when it asks for none) and has the scheduler
    /// record the cache's changes. Events need prefix caching: without it nothing is cached.
    pub(crate) fn start(
        cfg: Option<&KvEventsConfig>,
        prefix_caching: bool,
        block_size: usize,
        scheduler: &mut Scheduler,
    ) -> Result<Option<Self>, EngineError> {
        let Some(cfg) = cfg.filter(|c| c.publishes()) else { return Ok(None) };
        if !prefix_caching {
            return Err(EngineError::Config(
                "--kv-events-config: KV cache events describe the prefix cache; enable prefix caching".into(),
            ));
        }
        let publisher =
            KvEventPublisher::start(cfg, block_size).map_err(|e| EngineError::Config(e.to_string()))?;
        tracing::info!(
            target: "engine",
            "KV cache events on {} (replay: {})",
            publisher.endpoint(),
            publisher.replay_endpoint().unwrap_or("none")
        );
        scheduler.enable_cache_events();
        Ok(Some(Self { publisher, device: Vec::new(), host: Vec::new() }))
    }

    /// Publishes what the step changed, if anything: the device's changes (`GPU`), then the
    /// host swap space's (`CPU`): the two pools' hashes are separate sets, so the order between
    /// them carries nothing.
    pub(crate) fn after_step(&mut self, scheduler: &mut Scheduler) {
        scheduler.take_cache_events(&mut self.device, &mut self.host);
        if self.device.is_empty() && self.host.is_empty() {
            return;
        }
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let device = self.device.drain(..).map(|e| (Medium::Gpu, e));
        let events = device.chain(self.host.drain(..).map(|e| (Medium::Cpu, e))).collect();
        self.publisher.publish(&KvEventBatch { ts, events });
    }
}

impl Engine {
    /// The KV events publisher's PUB and replay addresses as bound (`None` when events are off).
    pub fn kv_events_endpoints(&self) -> Option<(String, Option<String>)> {
        let p = &self.kv_events.as_ref()?.publisher;
        Some((p.endpoint().to_owned(), p.replay_endpoint().map(str::to_owned)))
    }

    /// Every block hash in the device prefix cache, as events publish them: what a subscriber
    /// that applied every `GPU` event so far holds.
    pub fn cached_block_hashes(&self) -> Vec<u64> {
        self.scheduler.device_pool().cached_block_hashes()
    }

    /// The hashes of the registered blocks the host swap space holds (recorded only with events
    /// on): what a subscriber that applied every `CPU` event so far holds.
    pub fn host_block_hashes(&self) -> Vec<u64> {
        self.scheduler.host_pool().map_or_else(Vec::new, block_alloc::BlockPool::cached_block_hashes)
    }

    pub(super) fn publish_kv_events(&mut self) {
        if let Some(events) = &mut self.kv_events {
            events.after_step(&mut self.scheduler);
        }
    }
}
