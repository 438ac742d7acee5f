//! The dashboard: one page and its assets, embedded in the binary (no CDN, no network).

use axum::extract::Path;
use axum::http::{header, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// Only our own origin: the page can fetch nothing from elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn page(content_type: &'static str, body: &'static str) -> Response {
    let headers: [(HeaderName, &str); 4] = [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-cache"),
    ];
    (headers, body).into_response()
}

pub async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX)
}

pub async fn asset(Path(file): Path<String>) -> Response {
    match file.as_str() {
        "app.js" => page("text/javascript; charset=utf-8", APP_JS),
        "app.css" => page("text/css; charset=utf-8", APP_CSS),
        _ => (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    }
}
