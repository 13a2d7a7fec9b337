//! The web page at `GET /`: chat, the live KV block map and the KV cache calculator, as files
//! (`server/web/`: `index.html`, `style.css`, and ES modules: `app.js` starts one module per
//! app — `chat.js`, `kv_map.js`, `calculator.js` — over `shared.js`) embedded in the binary
//! with `include_str!` — plain HTML/CSS/JS, no build step, nothing fetched from elsewhere.
//!
//! The page talks only to this server's API (`/v1/models`, `/v1/chat/completions` with
//! `stream: true`, `/v1/kv_map/stream`, `/v1/plan`). Its own files are served outside
//! `/v1`, so loading the page needs no API key; its calls carry one from a field on the page as
//! `Authorization: Bearer`.
//! Every answer carries its content type, `Cache-Control: no-cache` (revalidate: a new binary
//! serves its new page at once) with an `ETag` of the content, and a content security policy
//! that allows only this origin's scripts and styles.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// One embedded file.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static str,
}

pub const INDEX: Asset =
    Asset { path: "/", content_type: "text/html; charset=utf-8", body: include_str!("../web/index.html") };
/// An ES module of the page, served as `text/javascript` (what a module script must be).
macro_rules! js_module {
    ($path:literal, $file:literal) => {
        Asset { path: $path, content_type: "text/javascript; charset=utf-8", body: include_str!($file) }
    };
}

pub const APP_JS: Asset = js_module!("/app.js", "../web/app.js");
pub const SHARED_JS: Asset = js_module!("/shared.js", "../web/shared.js");
pub const CHAT_JS: Asset = js_module!("/chat.js", "../web/chat.js");
pub const KV_MAP_JS: Asset = js_module!("/kv_map.js", "../web/kv_map.js");
pub const CALCULATOR_JS: Asset = js_module!("/calculator.js", "../web/calculator.js");
pub const STYLE_CSS: Asset = Asset {
    path: "/style.css",
    content_type: "text/css; charset=utf-8",
    body: include_str!("../web/style.css"),
};

/// Every route of the page.
pub const ASSETS: [Asset; 7] = [INDEX, APP_JS, SHARED_JS, CHAT_JS, KV_MAP_JS, CALCULATOR_JS, STYLE_CSS];

/// What the page may load: its own scripts, styles, fetches; inline styles only through the
/// DOM (`element.style`), images only as data URLs (the empty favicon).
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

impl Asset {
    /// A strong validator of the content: FNV-1a of the bytes (computed per request: the files
    /// are a few tens of KiB).
    pub fn etag(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.body.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("\"{h:016x}\"")
    }

    /// The file, or 304 when the client's `If-None-Match` names its current ETag.
    pub fn respond(&self, request_headers: &HeaderMap) -> Response {
        let etag = self.etag();
        let fresh = request_headers
            .get(header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
        let mut headers = HeaderMap::new();
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        if let Ok(v) = HeaderValue::from_str(&etag) {
            headers.insert(header::ETAG, v);
        }
        headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        if fresh {
            return (StatusCode::NOT_MODIFIED, headers).into_response();
        }
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(self.content_type));
        if self.path == "/" {
            headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
            headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
        }
        (headers, self.body).into_response()
    }
}

/// `router` with a `GET` route for every asset.
pub fn routes<S: Clone + Send + Sync + 'static>(mut router: axum::Router<S>) -> axum::Router<S> {
    for asset in ASSETS {
        router = router
            .route(asset.path, axum::routing::get(move |h: HeaderMap| async move { asset.respond(&h) }));
    }
    router
}
