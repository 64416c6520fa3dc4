//! Deadlines for request bodies, and a hook on the end of a response body.
//!
//! A client that sends its body slowly (a byte a second against a `Content-Length: 1000`)
//! holds a connection slot, and the task reading the body, for as long as it likes unless
//! the body has a deadline. The server (`kat-agent`'s `server.rs`) wraps every request body
//! with [`with_deadline`] as soon as the header has arrived; a handler that reads a body
//! after its deadline gets [`DeadlineMissed`], which [`read_body`](super::read_body) answers
//! with 408 `request_timeout`. Hyper then closes the connection (the rest of the body was not
//! read), which frees its slot. Only the request is timed: a response may stream for as long
//! as it needs (`logs -f`, `events --watch`), and the body of a request without one is empty
//! and ends at once.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::response::Response;
use hyper::body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};

type BoxError = Box<dyn StdError + Send + Sync>;

/// A request body that did not arrive within its deadline.
#[derive(Debug, Clone)]
pub struct DeadlineMissed {
    /// The deadline, counted from the end of the request header.
    pub after: Duration,
    /// Bytes of the body that had arrived by then.
    pub received: u64,
}

impl fmt::Display for DeadlineMissed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the request body did not arrive within {} ms of its header ({} bytes had); send it at a steady pace, or a smaller one",
            self.after.as_millis(),
            self.received
        )
    }
}

impl StdError for DeadlineMissed {}

/// `req` with a body that fails with [`DeadlineMissed`] once `after` has passed (from now)
/// and it has not ended.
pub fn with_deadline(req: Request, after: Duration) -> Request {
    req.map(|inner| {
        Body::new(DeadlineBody {
            inner,
            after,
            received: 0,
            timer: Box::pin(tokio::time::sleep_until(Instant::now() + after)),
            missed: false,
        })
    })
}

/// The [`DeadlineMissed`] somewhere in the chain of `error`'s sources, if any.
pub fn missed<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a DeadlineMissed> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(missed) = e.downcast_ref::<DeadlineMissed>() {
            return Some(missed);
        }
        next = e.source();
    }
    None
}

struct DeadlineBody {
    inner: Body,
    after: Duration,
    received: u64,
    timer: Pin<Box<Sleep>>,
    missed: bool,
}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.missed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.received += data.len() as u64;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.missed = true;
                    Poll::Ready(Some(Err(Box::new(DeadlineMissed {
                        after: self.after,
                        received: self.received,
                    }))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.missed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// `response` with `done` called once its body is gone: sent to the end, or dropped with
/// its connection.
pub fn on_body_end(response: Response, done: impl FnOnce() + Send + 'static) -> Response {
    response.map(|inner| {
        Body::new(Watched {
            inner,
            _done: OnDrop(Some(Box::new(done))),
        })
    })
}

type Done = Box<dyn FnOnce() + Send>;

struct OnDrop(Option<Done>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            done();
        }
    }
}

struct Watched {
    inner: Body,
    _done: OnDrop,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    #[tokio::test(start_paused = true)]
    async fn a_slow_body_misses_its_deadline_and_a_quick_one_does_not() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let req = with_deadline(
            Request::new(Body::from_stream(stream)),
            Duration::from_secs(30),
        );
        let sender = tokio::spawn(async move {
            for _ in 0..1000 {
                if tx.send(Ok(Bytes::from_static(b"x"))).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let started = Instant::now();
        let err = axum::body::to_bytes(req.into_body(), 4096)
            .await
            .unwrap_err();
        let missed = missed(&err).expect("a missed deadline");
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert_eq!(missed.received, 30);
        assert!(missed.to_string().contains("30000 ms"), "{missed}");
        sender.abort();

        let quick = with_deadline(Request::new(Body::from("hello")), Duration::from_secs(1));
        let mut data = quick.into_body().into_data_stream();
        assert_eq!(data.next().await.unwrap().unwrap(), "hello");
        assert!(data.next().await.is_none());
    }

    #[tokio::test]
    async fn the_hook_runs_when_the_response_body_is_gone() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let response = on_body_end(Response::new(Body::from("abc")), move || {
            let _ = tx.send(());
        });
        assert_eq!(response.body().size_hint().exact(), Some(3));
        let bytes = axum::body::to_bytes(response.into_body(), 16)
            .await
            .unwrap();
        assert_eq!(bytes, "abc");
        rx.await.unwrap();
    }
}
