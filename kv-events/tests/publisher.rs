//! The publisher over real sockets (zmq.rs clients here; `python/tests/test_kv_events.py`
//! checks it with libzmq's pyzmq and vLLM's documented msgspec types).

use std::time::Duration;

use block_alloc::CacheEvent;
use bytes::Bytes;
use kv_events::{END_SEQ, KvEventBatch, KvEventPublisher, KvEventsConfig, KvEventsError, Medium};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

fn config() -> KvEventsConfig {
    KvEventsConfig::from_json(
        r#"{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:0",
            "replay_endpoint": "tcp://127.0.0.1:0", "topic": "kv-events", "buffer_steps": 3}"#,
    )
    .unwrap()
}

fn batch(i: u64) -> KvEventBatch {
    KvEventBatch { ts: i as f64, events: vec![(Medium::Gpu, CacheEvent::Removed { block_hashes: vec![i] })] }
}

async fn recv(socket: &mut impl SocketRecv) -> Vec<Bytes> {
    tokio::time::timeout(Duration::from_secs(10), socket.recv())
        .await
        .expect("no message in 10 s")
        .unwrap()
        .into_vec()
}

#[tokio::test]
async fn live_batches_carry_topic_and_sequence_and_replay_answers_from_a_sequence_number() {
    let mut publisher = KvEventPublisher::start(&config(), 16).unwrap();
    let mut sub = SubSocket::new();
    sub.connect(publisher.endpoint()).await.unwrap();
    sub.subscribe("kv-events").await.unwrap();
    // A PUB drops what it sends before a subscription arrives: publish until one lands.
    let first = loop {
        publisher.publish(&batch(0));
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(100), sub.recv()).await {
            break m.into_vec();
        }
    };
    assert_eq!(first[0].as_ref(), b"kv-events");
    let seq0 = u64::from_be_bytes(first[1].as_ref().try_into().unwrap());
    assert_eq!(first[2].as_ref(), batch(0).encode(16).as_slice());
    for i in 1..=4 {
        publisher.publish(&batch(i));
    }
    let mut last = seq0;
    while last < seq0 + 4 {
        let frames = recv(&mut sub).await;
        let seq = u64::from_be_bytes(frames[1].as_ref().try_into().unwrap());
        assert_eq!(seq, last + 1);
        last = seq;
    }

    let mut replay = DealerSocket::new();
    replay.connect(publisher.replay_endpoint().unwrap()).await.unwrap();
    // Garbage first: ignored, and the socket still answers a good request afterwards.
    replay.send(ZmqMessage::from("garbage")).await.unwrap();
    replay.send(ZmqMessage::try_from(vec![Bytes::new(), Bytes::from_static(b"xyz")]).unwrap()).await.unwrap();
    replay
        .send(ZmqMessage::try_from(vec![Bytes::new(), Bytes::copy_from_slice(&0u64.to_be_bytes())]).unwrap())
        .await
        .unwrap();
    let mut seqs = Vec::new();
    loop {
        let frames = recv(&mut replay).await;
        assert_eq!((frames.len(), frames[0].len()), (3, 0), "{frames:?}");
        if frames[1].as_ref() == END_SEQ {
            assert!(frames[2].is_empty());
            break;
        }
        seqs.push(u64::from_be_bytes(frames[1].as_ref().try_into().unwrap()));
    }
    // buffer_steps = 3: only the last three batches are kept.
    assert_eq!(seqs, [last - 2, last - 1, last]);
    assert_eq!(publisher.num_dropped(), 0);
}

#[test]
fn an_endpoint_in_use_is_an_error_naming_it() {
    let publisher = KvEventPublisher::start(&config(), 16).unwrap();
    for taken in [publisher.endpoint(), publisher.replay_endpoint().unwrap()] {
        let mut cfg = config();
        cfg.replay_endpoint = Some(taken.to_owned());
        let err = KvEventPublisher::start(&cfg, 16).unwrap_err();
        assert!(matches!(&err, KvEventsError::Socket { endpoint, .. } if endpoint == taken), "{err}");
        assert!(err.to_string().contains(taken), "{err}");
    }
}

#[test]
fn a_malformed_connecting_endpoint_is_a_start_up_error_naming_it() {
    let mut cfg = config();
    cfg.endpoint = "tcp://127.0.0.1:not-a-port".to_owned();
    assert!(!KvEventsConfig::binds(&cfg.endpoint));
    let err = KvEventPublisher::start(&cfg, 16).unwrap_err();
    assert!(err.to_string().contains(&cfg.endpoint), "{err}");
}

/// An endpoint without a wildcard is connected to (a proxy's SUB side, which binds): with no
/// peer yet the publisher starts anyway and keeps trying, as libzmq does; once the peer binds,
/// live batches reach it, and replay answers for the ones published before.
#[tokio::test]
async fn a_connecting_publisher_reaches_a_peer_that_binds_later() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut cfg = config();
    cfg.endpoint = format!("tcp://127.0.0.1:{port}");
    let mut publisher = KvEventPublisher::start(&cfg, 16).unwrap();
    assert_eq!(publisher.endpoint(), cfg.endpoint);
    let early: Vec<u64> = (0..2).map(|i| publisher.publish(&batch(i))).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut sub = SubSocket::new();
    sub.bind(&cfg.endpoint).await.unwrap();
    sub.subscribe("kv-events").await.unwrap();
    let seq = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let seq = publisher.publish(&batch(9));
            if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(100), sub.recv()).await {
                let frames = m.into_vec();
                break (u64::from_be_bytes(frames[1].as_ref().try_into().unwrap()), seq);
            }
        }
    })
    .await
    .expect("the publisher never reached the peer");
    assert!(seq.0 > early[1], "{seq:?}");
    assert!(publisher.num_dropped() >= 2, "the batches before the peer went nowhere");
}
