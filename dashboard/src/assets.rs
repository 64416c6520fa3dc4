//! The stylesheet and the script, compiled in: the dashboard has no files to install.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

const CSS: &str = include_str!("../assets/kat.css");
const JS: &str = include_str!("../assets/kat.js");
const ICON: &str = include_str!("../assets/kat.svg");

pub async fn serve(Path(file): Path<String>) -> Response {
    let (body, content_type) = match file.as_str() {
        "kat.css" => (CSS, "text/css; charset=utf-8"),
        "kat.js" => (JS, "text/javascript; charset=utf-8"),
        "kat.svg" => (ICON, "image/svg+xml"),
        _ => return (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, content_type),
            // They change with the binary only; a new agent is a new page load anyway.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
