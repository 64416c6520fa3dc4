//! The byte framing of `exec` over an upgraded HTTP connection.
//!
//! After `101 Switching Protocols` both sides exchange frames: one byte of kind, four bytes
//! of big-endian length, then the payload. The client's first frame is [`Frame::Start`] with
//! an [`crate::wire::ExecRequest`] as JSON; the server's last frame is [`Frame::Exit`] (or
//! [`Frame::Error`]). A small framing of our own keeps both ends free of a WebSocket stack
//! while carrying what an interactive shell needs: stdin, stdout, stderr, resize, exit.

/// The `Upgrade` protocol name of an exec request.
pub const PROTOCOL: &str = "kat-exec.v1";

/// The largest payload accepted in one frame.
pub const MAX_FRAME: usize = 1 << 20;

/// One frame of an exec stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Client → server, first frame: the command as JSON.
    Start(Vec<u8>),
    /// Client → server: bytes for the command's stdin.
    Stdin(Vec<u8>),
    /// Client → server: no more stdin.
    CloseStdin,
    /// Client → server: the terminal's new size.
    Resize {
        /// The terminal's height, in rows.
        rows: u16,
        /// The terminal's width, in columns.
        cols: u16,
    },
    /// Server → client: bytes the command wrote to stdout.
    Stdout(Vec<u8>),
    /// Server → client: bytes the command wrote to stderr.
    Stderr(Vec<u8>),
    /// Server → client, last frame: the command's exit code.
    Exit(i32),
    /// Server → client, last frame: why the command could not run.
    Error(String),
}

/// Bytes that are not a valid frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The kind byte is none this version knows.
    #[error("unknown exec frame kind {0}")]
    UnknownKind(u8),
    /// The length field exceeds [`MAX_FRAME`]; it holds the length, in bytes.
    #[error("exec frame of {0} bytes exceeds the limit of {MAX_FRAME}")]
    TooLarge(usize),
    /// The payload does not fit the frame's kind (a resize or exit code that is not 4 bytes).
    #[error("exec frame of kind {kind} has a malformed payload")]
    Malformed {
        /// The kind byte of the frame.
        kind: u8,
    },
}

impl Frame {
    fn kind(&self) -> u8 {
        match self {
            Frame::Start(_) => 0,
            Frame::Stdin(_) => 1,
            Frame::CloseStdin => 2,
            Frame::Resize { .. } => 3,
            Frame::Stdout(_) => 4,
            Frame::Stderr(_) => 5,
            Frame::Exit(_) => 6,
            Frame::Error(_) => 7,
        }
    }

    /// The frame as bytes: kind, big-endian length, payload.
    pub fn encode(&self) -> Vec<u8> {
        let payload: Vec<u8> = match self {
            Frame::Start(b) | Frame::Stdin(b) | Frame::Stdout(b) | Frame::Stderr(b) => b.clone(),
            Frame::CloseStdin => vec![],
            Frame::Resize { rows, cols } => {
                let mut p = rows.to_be_bytes().to_vec();
                p.extend_from_slice(&cols.to_be_bytes());
                p
            }
            Frame::Exit(code) => code.to_be_bytes().to_vec(),
            Frame::Error(message) => message.as_bytes().to_vec(),
        };
        let mut out = Vec::with_capacity(5 + payload.len());
        out.push(self.kind());
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&payload);
        out
    }
}

/// Accumulates bytes from the connection and yields whole frames.
#[derive(Debug, Default)]
pub struct Decoder {
    buffer: Vec<u8>,
}

impl Decoder {
    /// Appends bytes read from the connection.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        let kind = self.buffer[0];
        let len = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if len > MAX_FRAME {
            return Err(FrameError::TooLarge(len));
        }
        if self.buffer.len() < 5 + len {
            return Ok(None);
        }
        let payload: Vec<u8> = self.buffer[5..5 + len].to_vec();
        self.buffer.drain(..5 + len);
        let malformed = FrameError::Malformed { kind };
        Ok(Some(match kind {
            0 => Frame::Start(payload),
            1 => Frame::Stdin(payload),
            2 => Frame::CloseStdin,
            3 => {
                let b: [u8; 4] = payload.as_slice().try_into().map_err(|_| malformed)?;
                Frame::Resize {
                    rows: u16::from_be_bytes([b[0], b[1]]),
                    cols: u16::from_be_bytes([b[2], b[3]]),
                }
            }
            4 => Frame::Stdout(payload),
            5 => Frame::Stderr(payload),
            6 => {
                let b: [u8; 4] = payload.as_slice().try_into().map_err(|_| malformed)?;
                Frame::Exit(i32::from_be_bytes(b))
            }
            7 => Frame::Error(String::from_utf8_lossy(&payload).into_owned()),
            other => return Err(FrameError::UnknownKind(other)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_across_arbitrary_splits() {
        let frames = vec![
            Frame::Start(br#"{"command":["sh"]}"#.to_vec()),
            Frame::Stdin(b"echo hi\n".to_vec()),
            Frame::Resize {
                rows: 40,
                cols: 120,
            },
            Frame::CloseStdin,
            Frame::Stdout(vec![0, 255, 10]),
            Frame::Stderr(vec![]),
            Frame::Exit(-9),
            Frame::Error("no such instance".into()),
        ];
        let bytes: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        for split in [1, 3, 7, bytes.len()] {
            let mut decoder = Decoder::default();
            let mut out = Vec::new();
            for chunk in bytes.chunks(split) {
                decoder.push(chunk);
                while let Some(f) = decoder.next_frame().unwrap() {
                    out.push(f);
                }
            }
            assert_eq!(out, frames, "split {split}");
        }
    }

    #[test]
    fn hostile_frames_are_errors_not_panics() {
        let mut d = Decoder::default();
        d.push(&[9, 0, 0, 0, 0]);
        assert_eq!(d.next_frame(), Err(FrameError::UnknownKind(9)));
        let mut d = Decoder::default();
        d.push(&[1, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(d.next_frame(), Err(FrameError::TooLarge(_))));
        let mut d = Decoder::default();
        d.push(&[6, 0, 0, 0, 2, 1, 2]);
        assert_eq!(d.next_frame(), Err(FrameError::Malformed { kind: 6 }));
    }
}
