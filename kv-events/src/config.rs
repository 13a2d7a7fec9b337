//! `KvEventsConfig`: vLLM's `--kv-events-config` JSON, its defaults and its checks.

use serde::Deserialize;

use crate::KvEventsError;

/// Messages the PUB socket queues per subscriber (zmq.rs's fixed send queue; vLLM's default
/// `hwm`).
pub const PUB_QUEUE: usize = 100_000;

/// Where and how KV cache events are published (vLLM's `KVEventsConfig`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventsConfig {
    /// Whether the engine records and publishes events at all.
    pub enable_kv_cache_events: bool,
    /// `"zmq"` (PUB socket plus a replay ROUTER socket) or `"null"` (record nothing).
    pub publisher: String,
    /// The PUB socket's address: bound when it names a wildcard host (`tcp://*:5557`) or a
    /// port of 0 (any free port), else connected to (a proxy's SUB side), as vLLM does.
    pub endpoint: String,
    /// The ROUTER socket that answers replay requests (always bound); `None`: no replay.
    pub replay_endpoint: Option<String>,
    /// Past batches kept for replay.
    pub buffer_steps: usize,
    /// vLLM's PUB high-water mark: messages queued per subscriber before a slow one misses
    /// some. The zmq.rs PUB socket's queue is fixed at [`PUB_QUEUE`], vLLM's default, so that is
    /// the one value taken; any other is refused rather than ignored.
    pub hwm: usize,
    /// Batches waiting for the publisher thread; past this the oldest are dropped from the
    /// live stream (they stay in the replay buffer).
    pub max_queue_size: usize,
    /// The first frame of every published message (subscribers filter on its prefix).
    pub topic: String,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            enable_kv_cache_events: false,
            publisher: "null".into(),
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: PUB_QUEUE,
            max_queue_size: 100_000,
            topic: String::new(),
        }
    }
}

impl KvEventsConfig {
    /// Parses vLLM's JSON form; an unknown field, a wrong type or a bad value is an error
    /// naming it. vLLM's rule applies: with events enabled and `publisher` left out, the
    /// publisher is `"zmq"`.
    pub fn from_json(text: &str) -> Result<Self, KvEventsError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| KvEventsError::Config(format!("not JSON: {e}")))?;
        let publisher_given = value.get("publisher").is_some();
        let mut cfg: Self =
            serde_json::from_value(value).map_err(|e| KvEventsError::Config(e.to_string()))?;
        if cfg.enable_kv_cache_events && !publisher_given {
            cfg.publisher = "zmq".into();
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Whether a publisher is to be started.
    pub fn publishes(&self) -> bool {
        self.enable_kv_cache_events && self.publisher == "zmq"
    }

    /// Checks every field's value.
    pub fn validate(&self) -> Result<(), KvEventsError> {
        let bad = |field: &str, why: &str| Err(KvEventsError::Config(format!("`{field}`: {why}")));
        if !matches!(self.publisher.as_str(), "zmq" | "null") {
            return bad("publisher", &format!("{:?} is not one of \"zmq\", \"null\"", self.publisher));
        }
        for (field, value) in [("buffer_steps", self.buffer_steps), ("max_queue_size", self.max_queue_size)] {
            if value == 0 {
                return bad(field, "must be at least 1");
            }
        }
        if self.hwm != PUB_QUEUE {
            let why = format!(
                "{} is not supported: the PUB socket queues {PUB_QUEUE} messages per subscriber",
                self.hwm
            );
            return bad("hwm", &why);
        }
        if self.publishes() {
            check_endpoint("endpoint", &self.endpoint)?;
            if let Some(replay) = &self.replay_endpoint {
                check_endpoint("replay_endpoint", replay)?;
                if replay == &self.endpoint && !replay.ends_with(":0") {
                    return bad(
                        "replay_endpoint",
                        "must differ from `endpoint` (port 0 excepted: each gets a free port)",
                    );
                }
            }
        }
        Ok(())
    }

    /// Whether the PUB socket binds `endpoint` (else it connects): vLLM's rule for TCP (a
    /// wildcard host) plus port 0.
    pub fn binds(endpoint: &str) -> bool {
        endpoint.contains('*') || endpoint.contains("::") || endpoint.ends_with(":0")
    }
}

/// `tcp://HOST:PORT` with a port in range (zmq.rs serves TCP; `ipc://` and `inproc://` are not
/// offered here).
fn check_endpoint(field: &str, endpoint: &str) -> Result<(), KvEventsError> {
    let bad = |why: String| Err(KvEventsError::Config(format!("`{field}` {endpoint:?}: {why}")));
    let Some(rest) = endpoint.strip_prefix("tcp://") else {
        return bad("only tcp://HOST:PORT endpoints are served".into());
    };
    let Some((host, port)) = rest.rsplit_once(':') else { return bad("no port".into()) };
    if host.is_empty() {
        return bad("no host (use `*` for every interface)".into());
    }
    if port.parse::<u16>().is_err() {
        return bad(format!("port {port:?} is not a number in 0..=65535"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllms_example_parses_with_zmq_implied() {
        let cfg = KvEventsConfig::from_json(
            r#"{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}"#,
        )
        .unwrap();
        assert!(cfg.publishes());
        assert_eq!((cfg.topic.as_str(), cfg.buffer_steps), ("kv-events", 10_000));
        assert!(KvEventsConfig::binds(&cfg.endpoint));
        assert!(!KvEventsConfig::binds("tcp://127.0.0.1:5557"));
        assert!(KvEventsConfig::binds("tcp://127.0.0.1:0"));
        let off = KvEventsConfig::from_json(r#"{"enable_kv_cache_events": false}"#).unwrap();
        assert!(!off.publishes());
    }

    #[test]
    fn bad_configs_name_what_is_wrong() {
        for (json, names) in [
            ("{", "not JSON"),
            (r#"{"enable_kv_cache_events": true, "endpont": "x"}"#, "endpont"),
            (r#"{"enable_kv_cache_events": "yes"}"#, "invalid type"),
            (r#"{"enable_kv_cache_events": true, "publisher": "kafka"}"#, "publisher"),
            (r#"{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/x"}"#, "endpoint"),
            (r#"{"enable_kv_cache_events": true, "endpoint": "tcp://*:99999"}"#, "99999"),
            (r#"{"enable_kv_cache_events": true, "endpoint": "tcp://:5"}"#, "no host"),
            (r#"{"enable_kv_cache_events": true, "replay_endpoint": "tcp://*:5557"}"#, "must differ"),
            (r#"{"enable_kv_cache_events": true, "buffer_steps": 0}"#, "buffer_steps"),
            (r#"{"enable_kv_cache_events": true, "hwm": 1000}"#, "`hwm`: 1000 is not supported"),
        ] {
            let err = KvEventsConfig::from_json(json).unwrap_err().to_string();
            assert!(err.contains(names), "{json}: {err}");
        }
    }
}
