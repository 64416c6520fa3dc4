//! What the log-following tests share: a log record line and a runtime shaped like the
//! agent's (two workers).

/// A record as kat-init writes it.
pub fn line(text: &str) -> String {
    format!("2026-11-26T10:00:00.000000000Z stdout F {text}\n")
}

/// A multi-threaded runtime with two workers, as the agent's.
pub fn agent_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}
