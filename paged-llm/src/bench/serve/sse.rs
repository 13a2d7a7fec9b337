//! One streamed completion over HTTP: the request, its server-sent events read as they arrive,
//! and the times of the tokens; and the HTTP/1 client (hyper's) that sends it.

use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use super::RequestResult;

/// A pooled HTTP/1 client over plain TCP (the benchmark talks to a server on its network).
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

/// `GET url`: its JSON body (an error for a status other than 2xx).
pub async fn get_json(client: &HttpClient, url: &str) -> anyhow::Result<serde_json::Value> {
    let request = hyper::Request::get(url).body(Full::default())?;
    let response = client.request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        anyhow::bail!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body).chars().take(200).collect::<String>()
        );
    }
    serde_json::from_slice(&body).context("the body is not JSON")
}

/// Sends `body` to `url` and times its stream; a failure is a result with `ok: false` and the
/// error's text (the benchmark goes on).
pub async fn stream_completion(client: &HttpClient, url: &str, body: &serde_json::Value) -> RequestResult {
    let sent = Instant::now();
    match timed_stream(client, url, body, sent).await {
        Ok(result) => result,
        Err(e) => RequestResult {
            ok: false,
            error: format!("{e:#}"),
            latency: sent.elapsed().as_secs_f64(),
            ..Default::default()
        },
    }
}

async fn timed_stream(
    client: &HttpClient,
    url: &str,
    body: &serde_json::Value,
    sent: Instant,
) -> anyhow::Result<RequestResult> {
    let request = hyper::Request::post(url)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body)?)))?;
    let response = client.request(request).await?;
    let status = response.status();
    let mut frames = response.into_body();
    if !status.is_success() {
        let text = frames.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        anyhow::bail!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&text).chars().take(200).collect::<String>()
        );
    }
    let mut result = RequestResult::default();
    let mut last_token: Option<Instant> = None;
    let mut pending = Vec::<u8>::new();
    let mut done = false;
    while let Some(frame) = frames.frame().await {
        let arrived = Instant::now();
        let Ok(chunk) = frame?.into_data() else { continue };
        pending.extend_from_slice(&chunk);
        while let Some(end) = find_event_end(&pending) {
            let event: Vec<u8> = pending.drain(..end).collect();
            for line in String::from_utf8_lossy(&event).lines() {
                let Some(data) = line.strip_prefix("data:").map(str::trim) else { continue };
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let value: serde_json::Value = serde_json::from_str(data)?;
                if let Some(message) = value.get("error") {
                    anyhow::bail!("server error in the stream: {message}");
                }
                if let Some(usage) = value.get("usage").filter(|u| !u.is_null()) {
                    result.prompt_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0) as usize;
                    result.output_tokens = usage["completion_tokens"].as_u64().unwrap_or(0) as usize;
                }
                let has_text = value["choices"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["text"].as_str().is_some_and(|t| !t.is_empty())));
                if has_text {
                    match last_token {
                        None => result.ttft = (arrived - sent).as_secs_f64(),
                        Some(previous) => result.itl.push((arrived - previous).as_secs_f64()),
                    }
                    last_token = Some(arrived);
                }
            }
        }
    }
    if !done {
        anyhow::bail!("the stream ended without [DONE]");
    }
    if last_token.is_none() {
        anyhow::bail!("the stream carried no token");
    }
    result.latency = sent.elapsed().as_secs_f64();
    result.ok = true;
    Ok(result)
}

/// The end (exclusive) of the first whole event in `buf`: after its blank line.
fn find_event_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_end_at_their_blank_line() {
        assert_eq!(find_event_end(b"data: 1\n\ndata: 2"), Some(9));
        assert_eq!(find_event_end(b"data: 1\r\n\r\n"), Some(11));
        assert_eq!(find_event_end(b"data: 1\n"), None);
    }
}
