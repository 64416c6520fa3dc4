//! The HTML: the page frame, the sign-in page, and the small pieces every page uses (ages,
//! sizes, usage meters, state badges). Each page's content is in a module of its own.
//!
//! maud escapes every value it interpolates; nothing here is marked pre-escaped.

pub mod admin;
pub mod cluster;
pub mod events;
pub mod instance;
pub mod workload;
pub mod workloads;

use std::time::SystemTime;

use kat_api::timestamp::Timestamp;
use maud::{html, Markup, DOCTYPE};

use crate::pages::Page;
use crate::session::{Flash, Session};

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            meta name="color-scheme" content="light dark";
            title { (title) " · KAT" }
            link rel="icon" href={ (crate::PREFIX) "/assets/kat.svg" };
            link rel="stylesheet" href={ (crate::PREFIX) "/assets/kat.css" };
            script src={ (crate::PREFIX) "/assets/kat.js" } defer {}
        }
    }
}

/// A whole page: the frame, the navigation this session may use, a message from the last
/// form, and the content. With `live`, the content follows the cluster (`kat.js`).
pub fn layout(
    session: &Session,
    page: &Page,
    flash: Option<Flash>,
    content: Markup,
    live: bool,
) -> Markup {
    let workloads = Page::Workloads {
        ns: session
            .credential
            .namespace()
            .unwrap_or("default")
            .to_string(),
    };
    let nav = [
        (Page::Cluster, "Cluster"),
        (workloads, "Workloads"),
        (Page::Events, "Events"),
        (Page::Backups, "Backups"),
        (Page::JoinTokens, "Join tokens"),
    ];
    let current = std::mem::discriminant(page);
    // Only under an instance page that is shown: its script opens the output's stream.
    let logs = match page {
        Page::Instance { ns, name, id } if live => Some(instance::logs_panel(ns, name, id)),
        _ => None,
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(&page.title()))
            body {
                header {
                    a.brand href=(crate::PREFIX) { "KAT" }
                    nav {
                        @for (target, label) in &nav {
                            @if target.visible_to(session) {
                                a href=(target.href())
                                    aria-current=[(std::mem::discriminant(target) == current).then_some("page")]
                                    { (label) }
                            }
                        }
                    }
                    div.who {
                        @if session.credential.read_only() {
                            span.badge.readonly { "read-only" }
                        }
                        @if let Some(ns) = session.credential.namespace() {
                            span.badge { "namespace " (ns) }
                        }
                        form method="post" action={ (crate::PREFIX) "/logout" } {
                            input type="hidden" name="csrf" value=(session.csrf);
                            button.link type="submit" { "Sign out" }
                        }
                    }
                }
                main {
                    @if let Some(flash) = flash {
                        p.flash.ok[flash.ok].error[!flash.ok] role="status" { (flash.text) }
                    }
                    div #content data-live=[live.then(|| page.href())] { (content) }
                    @if let Some(logs) = logs { (logs) }
                }
            }
        }
    }
}

pub fn sign_in(problem: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head("Sign in"))
            body.signin {
                main {
                    h1 { "KAT" }
                    form method="post" action={ (crate::PREFIX) "/login" } {
                        label for="token" { "Token" }
                        input #token type="password" name="token" autocomplete="current-password" required autofocus;
                        button type="submit" { "Sign in" }
                    }
                    @if let Some(problem) = problem {
                        p.flash.error role="alert" { (problem) }
                    }
                    p.hint {
                        "The admin token is the " code { "token" } " in katcall's config; "
                        code { "katcall create token --read-only" } " makes one that can only look."
                    }
                }
            }
        }
    }
}

/// A page's content when it cannot be shown.
pub fn problem(title: &str, message: &str) -> Markup {
    html! {
        section.problem {
            h1 { (title) }
            p { (message) }
        }
    }
}

/// "12s", "5m", "3h", "2d": how long ago `t` was (as katcall's tables say it).
pub fn ago(t: Timestamp) -> String {
    t.age_text(SystemTime::now())
}

/// A time with how long ago it was, the exact time on hover.
pub fn when(t: Timestamp) -> Markup {
    html! { time datetime=(t.to_string()) title=(t.to_string()) { (ago(t)) " ago" } }
}

/// Sizes as katcall and the Quadlet files write them (`64Mi`, `2.4Gi`).
pub use kat_api::quantity::format_bytes as bytes;

/// A usage meter with its figures beside it; nothing to show without a total.
pub fn meter(used: u64, total: u64, text: String) -> Markup {
    html! {
        @if total > 0 {
            span.usage {
                meter min="0" max=(total) low=(total / 10 * 7) high=(total / 10 * 9) optimum="0" value=(used.min(total)) {}
                span { (text) }
            }
        } @else {
            span.muted { "—" }
        }
    }
}

/// A state as a badge: green when all is well, amber on the way, red when not.
pub fn badge(text: &str) -> Markup {
    let tone = match text {
        "Ready" | "Running" | "Healthy" | "Succeeded" | "Normal" | "complete" => "good",
        "Failed" | "OOMKilled" | "Unhealthy" | "NotReady" | "Warning" | "stalled" | "Unknown" => {
            "bad"
        }
        _ => "busy",
    };
    html! { span class={ "badge " (tone) } { (text) } }
}

/// The first 12 characters of a hash or digest.
pub fn short(hash: &str) -> &str {
    let hash = hash.strip_prefix("sha256:").unwrap_or(hash);
    hash.get(..12).unwrap_or(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_shortened() {
        assert_eq!(short("sha256:0123456789abcdef"), "0123456789ab");
        assert_eq!(short("abc"), "abc");
    }

    #[test]
    fn interpolated_text_is_escaped() {
        let html = problem("<b>", "<script>alert(1)</script>").into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;"), "{html}");
    }
}
