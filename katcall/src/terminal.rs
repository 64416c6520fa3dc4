//! The local terminal for `exec -t`: raw mode while the session lasts, and its size.

use std::os::fd::AsFd;

use anyhow::{Context, Result};
use nix::sys::termios::{self, SetArg, Termios};

/// Puts stdin in raw mode; restores it when dropped.
pub struct RawMode {
    saved: Termios,
}

impl RawMode {
    pub fn enter() -> Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd())
            .context("-t needs a terminal on stdin (drop -t to pipe input)")?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw).context("setting raw mode")?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, &self.saved);
    }
}

nix::ioctl_read_bad!(tiocgwinsz, nix::libc::TIOCGWINSZ, nix::libc::winsize);

/// (rows, cols) of the terminal on stdout.
pub fn size() -> Option<(u16, u16)> {
    let mut ws = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: fd 1 is ours for the process's life and `ws` is a valid winsize to fill.
    unsafe { tiocgwinsz(1, &mut ws) }.ok()?;
    (ws.ws_row > 0).then_some((ws.ws_row, ws.ws_col))
}
