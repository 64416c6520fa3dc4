//! `katcall create join-token` flags as a user types them: bad input is refused before
//! anything is sent, with the flag named.

use std::process::Command;

fn katcall(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_katcall"))
        .args(args)
        // No cluster: nothing here may get as far as sending a request.
        .env("KAT_CONFIG", "/nonexistent/katcall.yaml")
        .output()
        .expect("run katcall");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_join_token_flags_name_the_flag() {
    let (code, err) = katcall(&["create", "join-token", "--address", "nope"]);
    assert_ne!(code, 0);
    assert!(err.contains("--address"), "{err}");
    let (code, err) = katcall(&["create", "join-token", "--uses", "0"]);
    assert_ne!(code, 0);
    assert!(err.contains("--uses"), "{err}");
    let (code, err) = katcall(&["create", "namespace", "team", "--control-plane"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("apply to `katcall create join-token` only"),
        "{err}"
    );
    // Good flags get as far as the (missing) config.
    let (code, err) = katcall(&[
        "create",
        "join-token",
        "--control-plane",
        "--ttl",
        "30m",
        "--uses",
        "1",
        "--address",
        "192.0.2.7",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("/nonexistent/katcall.yaml"), "{err}");
}
