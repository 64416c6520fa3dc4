//! Containers on the real kernel: create, start, logs, exit codes, stop, remove.

mod support;

use kat_runtime::ContainerRuntime;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_a_container_and_collects_output_and_exit_code() {
    let (rt, _dir, f) = ready_runtime().await;
    let (code, out) = run(
        &rt,
        "hello",
        &image(&f),
        "echo hello from $(hostname); echo err >&2; exit 3",
    )
    .await;
    assert_eq!(code, 3);
    assert_eq!(out, ["hello from hello", "err"]);
    eprintln!("capabilities: {:?}", rt.capabilities());
    rt.remove("hello", false).await.unwrap();
}
