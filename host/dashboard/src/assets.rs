//! The pages, embedded in the binary: plain HTML, one ES module and a stylesheet, and the one
//! charting library, vendored (`assets/vendor/`); no build step. They read only the JSON API and
//! the event stream.

use axum::response::Response;

use crate::api::page;

pub(crate) async fn index() -> Response {
    page("text/html; charset=utf-8", include_str!("../assets/index.html"))
}

pub(crate) async fn script() -> Response {
    page("text/javascript; charset=utf-8", include_str!("../assets/app.js"))
}

pub(crate) async fn style() -> Response {
    page("text/css; charset=utf-8", include_str!("../assets/style.css"))
}

/// uPlot, the pages' charts (`assets/vendor/uplot-1.6.32/README.md`).
pub(crate) async fn chart_script() -> Response {
    page("text/javascript; charset=utf-8", include_str!("../assets/vendor/uplot-1.6.32/uPlot.iife.min.js"))
}

pub(crate) async fn chart_style() -> Response {
    page("text/css; charset=utf-8", include_str!("../assets/vendor/uplot-1.6.32/uPlot.min.css"))
}
