//! The detacher on fakes with simulated time: a parent whose answers the test sets, a LAN on
//! which a leader (with a real CA and signatures) answers rejoin requests, and a local
//! cluster that writes down what is done to it. Every fake writes to one journal, so the
//! tests check the order of what happens, which is the point of a rejoin.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kat_api::wire::{
    ErrorCode, InstanceId, InstanceRecord, InstanceState, InstanceStatus, RejoinRequest,
};
use kat_client::ClientError;
use kat_pki::Pki;
use reqwest::StatusCode;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::*;
use crate::supervisor::assignments::Assignment;

const LEADER: &str = "https://10.0.0.1:9115";

type Journal = Arc<Mutex<Vec<String>>>;

fn note(journal: &Journal, what: impl Into<String>) {
    journal.lock().unwrap().push(what.into());
}

fn unreachable() -> ClientError {
    ClientError::Unreachable {
        base: LEADER.into(),
        // A request that cannot be built: an error of the client's own kind, without I/O.
        source: reqwest::Client::new().get("not a url").build().unwrap_err(),
    }
}

fn refused(status: StatusCode, code: ErrorCode) -> ClientError {
    ClientError::Refused {
        status,
        code: Some(code),
        message: format!("refused with {code:?}"),
        leader: None,
    }
}

/// What the fakes answer; the test changes it while the detacher runs.
#[derive(Default)]
struct Script {
    /// The parent's answers to probes, first to last; then yes.
    probes: Vec<kat_client::Result<()>>,
    /// The parent's answer to a submission of a namespace's workload; yes by default.
    submit: BTreeMap<String, fn() -> ClientError>,
    /// Whether the leader on the LAN answers requests, and with which CA's key.
    offers: Option<Arc<Pki>>,
    /// Whether no channel for requests can be opened (no multicast here).
    lan_down: bool,
    /// Whether a local cluster from before is there.
    left_over: bool,
    /// The local cluster's workloads.
    workloads: Vec<LocalWorkload>,
    /// Its instances.
    instances: Vec<InstanceId>,
}

struct World {
    journal: Journal,
    script: Arc<Mutex<Script>>,
    contact: Arc<watch::Sender<Option<Instant>>>,
    statuses: watch::Sender<Statuses>,
    dir: tempfile::TempDir,
    _cluster: super::protocol::tests::Cluster,
    laptop: Arc<Pki>,
    leader: Arc<Pki>,
    stranger: Arc<Pki>,
}

struct FakeParent {
    journal: Journal,
    script: Arc<Mutex<Script>>,
    contact: watch::Receiver<Option<Instant>>,
}

#[async_trait::async_trait]
impl Parent for FakeParent {
    fn contact(&self) -> watch::Receiver<Option<Instant>> {
        self.contact.clone()
    }
    fn leader(&self) -> Option<String> {
        Some(LEADER.into())
    }
    fn revoked(&self) -> Arc<HashSet<String>> {
        Arc::default()
    }
    async fn subnet(&self) -> Option<String> {
        Some("10.42.3.0/24".into())
    }
    async fn probe(&self, leader: &str) -> kat_client::Result<()> {
        note(&self.journal, format!("probe {leader}"));
        let mut script = self.script.lock().unwrap();
        match script.probes.is_empty() {
            true => Ok(()),
            false => script.probes.remove(0),
        }
    }
    async fn submit(&self, _: &str, ns: &str, bundle: Vec<u8>) -> kat_client::Result<()> {
        let files = kat_api::bundle::unpack(&bundle, &Default::default())
            .expect("a bundle the detacher packed");
        note(
            &self.journal,
            format!(
                "submit {ns} ({})",
                files.keys().cloned().collect::<Vec<_>>().join(",")
            ),
        );
        match self.script.lock().unwrap().submit.get(ns) {
            Some(answer) => Err(answer()),
            None => Ok(()),
        }
    }
    fn follow(&self, leader: &str) {
        note(&self.journal, format!("follow {leader}"));
    }
}

/// The LAN: requests reach a leader that answers with an offer signed by the script's key.
struct Lan {
    script: Arc<Mutex<Script>>,
}

struct LanChannel {
    script: Arc<Mutex<Script>>,
    answers: (mpsc::Sender<Vec<u8>>, mpsc::Receiver<Vec<u8>>),
}

#[async_trait::async_trait]
impl RejoinTransport for Lan {
    async fn open(&self) -> std::io::Result<Box<dyn RejoinChannel>> {
        if self.script.lock().unwrap().lan_down {
            return Err(std::io::Error::other("no multicast on this host"));
        }
        Ok(Box::new(LanChannel {
            script: self.script.clone(),
            answers: mpsc::channel(16),
        }))
    }
}

#[async_trait::async_trait]
impl RejoinChannel for LanChannel {
    async fn send(&mut self, datagram: &[u8]) -> std::io::Result<()> {
        let request: RejoinRequest = serde_json::from_slice(datagram).expect("a request");
        let key = self.script.lock().unwrap().offers.clone();
        if let Some(key) = key {
            let offer = protocol::offer(&request, LEADER, &key, SystemTime::now()).unwrap();
            let _ = self.answers.0.try_send(serde_json::to_vec(&offer).unwrap());
        }
        Ok(())
    }
    async fn receive(&mut self, buf: &mut [u8]) -> std::io::Result<(usize, String)> {
        match self.answers.1.recv().await {
            Some(datagram) => {
                buf[..datagram.len()].copy_from_slice(&datagram);
                Ok((datagram.len(), "10.0.0.1:7946".into()))
            }
            None => std::future::pending().await,
        }
    }
}

struct FakeClusters {
    journal: Journal,
    script: Arc<Mutex<Script>>,
}

struct FakeCluster {
    journal: Journal,
    script: Arc<Mutex<Script>>,
}

#[async_trait::async_trait]
impl LocalClusters for FakeClusters {
    type Cluster = FakeCluster;
    async fn left_over(&self) -> bool {
        self.script.lock().unwrap().left_over
    }
    async fn start(&self, subnet: Option<String>, why: &str) -> Result<FakeCluster> {
        let subnet = subnet.unwrap_or_default();
        note(&self.journal, format!("start on {subnet}: {why}"));
        self.script.lock().unwrap().left_over = true;
        Ok(FakeCluster {
            journal: self.journal.clone(),
            script: self.script.clone(),
        })
    }
    fn rejoined(&self) {
        note(&self.journal, "worker API");
    }
    async fn retire(&self) {
        note(&self.journal, "retire");
        self.script.lock().unwrap().left_over = false;
    }
}

#[async_trait::async_trait]
impl LocalCluster for FakeCluster {
    fn ended(&mut self) -> Option<String> {
        None
    }
    async fn close(&mut self) -> Vec<InstanceId> {
        note(&self.journal, "close");
        self.script.lock().unwrap().instances.clone()
    }
    async fn workloads(&self) -> Result<Vec<LocalWorkload>> {
        Ok(self.script.lock().unwrap().workloads.clone())
    }
    async fn forget(&mut self, ns: &str, name: &str) -> Result<()> {
        note(&self.journal, format!("forget {ns}/{name}"));
        self.script
            .lock()
            .unwrap()
            .workloads
            .retain(|w| (w.namespace.as_str(), w.name.as_str()) != (ns, name));
        Ok(())
    }
    async fn stop(self) {
        note(&self.journal, "local cluster stopped");
    }
}

/// A cluster (the leader's and this worker's keys, another cluster's) and nothing done yet.
fn world() -> World {
    let cluster = super::protocol::tests::cluster();
    World {
        journal: Journal::default(),
        script: Arc::default(),
        contact: Arc::new(watch::channel(None).0),
        statuses: watch::channel(None).0,
        laptop: Arc::new(cluster.laptop.clone()),
        leader: Arc::new(cluster.leader.clone()),
        stranger: Arc::new(cluster.stranger.clone()),
        dir: tempfile::tempdir().unwrap(),
        _cluster: cluster,
    }
}

impl World {
    /// The detacher, running, with `node_loss`.
    fn start(&self, node_loss: Duration) {
        let detacher = Detacher {
            node: "laptop".into(),
            parent_cluster: "home".into(),
            node_loss,
            pki: self.laptop.clone(),
            parent: Arc::new(FakeParent {
                journal: self.journal.clone(),
                script: self.script.clone(),
                contact: self.contact.subscribe(),
            }),
            transport: Arc::new(Lan {
                script: self.script.clone(),
            }),
            local: FakeClusters {
                journal: self.journal.clone(),
                script: self.script.clone(),
            },
            statuses: self.statuses.subscribe(),
            layout: Layout::new(self.dir.path()),
        };
        tokio::spawn(detacher.run());
    }

    fn journal(&self) -> Vec<String> {
        self.journal.lock().unwrap().clone()
    }

    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().unwrap()
    }

    /// Simulated time until `what` is in the journal (at most `within`).
    async fn until(&self, what: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.journal().iter().any(|l| l.starts_with(what)) {
            assert!(
                Instant::now() < deadline,
                "no {what:?} within {within:?}; the journal: {:#?}",
                self.journal()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Each local instance running, as the supervisor says.
    fn running(&self, ids: &[&InstanceId], state: InstanceState) {
        let list = ids
            .iter()
            .map(|id| InstanceStatus::new((*id).clone(), "lab".into(), "w".into(), 1, state))
            .collect();
        self.statuses.send_replace(Some(list));
    }
}

fn workload(ns: &str, name: &str) -> LocalWorkload {
    LocalWorkload {
        namespace: ns.into(),
        name: name.into(),
        files: BTreeMap::from([(
            "workload.kat".to_string(),
            format!("name: {name}\n").into_bytes(),
        )]),
    }
}

fn position(journal: &[String], what: &str) -> usize {
    journal
        .iter()
        .position(|l| l.starts_with(what))
        .unwrap_or_else(|| panic!("no {what:?} in {journal:#?}"))
}

#[tokio::test(start_paused = true)]
async fn a_node_detaches_once_the_leader_is_silent_for_the_node_loss_timeout() {
    let w = world();
    w.contact.send_replace(Some(Instant::now()));
    w.start(Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(w.journal().is_empty(), "{:?}", w.journal());
    // The leader answers again: the count starts over.
    w.contact.send_replace(Some(Instant::now()));
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(w.journal().is_empty(), "{:?}", w.journal());
    w.until("start", Duration::from_secs(3)).await;
    let journal = w.journal();
    assert_eq!(journal.len(), 1, "{journal:?}");
    // The parent's subnet (none saved by the node network here), and why.
    assert!(
        journal[0].starts_with("start on 10.42.3.0/24: the leader of home has not answered"),
        "{journal:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_local_cluster_left_from_before_is_started_again_at_once() {
    let w = world();
    w.script().left_over = true;
    // The leader answered a moment ago: the left-over cluster still comes first.
    w.contact.send_replace(Some(Instant::now()));
    w.start(Duration::from_secs(30));
    w.until("start", Duration::from_secs(2)).await;
    assert!(
        w.journal()[0].ends_with("its local cluster from before is still there"),
        "{:?}",
        w.journal()
    );
}

#[tokio::test(start_paused = true)]
async fn an_offer_rejoins_after_the_local_instances_stopped_and_hands_over_every_workload() {
    let w = world();
    let l1 = InstanceId::parse("w-00000001").unwrap();
    {
        let mut s = w.script();
        s.workloads = vec![workload("lab", "notes"), workload("lab2", "db")];
        s.instances = vec![l1.clone()];
    }
    w.running(&[&l1], InstanceState::Running);
    w.start(Duration::from_secs(1));
    w.until("start", Duration::from_secs(5)).await;
    // Detached; the leader on the LAN starts answering.
    w.script().offers = Some(w.leader.clone());
    w.until("close", Duration::from_secs(10)).await;
    // The local instance takes a while to stop: nothing is submitted meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !w.journal().iter().any(|l| l.starts_with("submit")),
        "{:?}",
        w.journal()
    );
    note(&w.journal, "instances stopped");
    w.running(&[&l1], InstanceState::Failed);
    w.until("retire", Duration::from_secs(10)).await;
    let journal = w.journal();
    let order = [
        "start",
        &format!("probe {LEADER}"),
        "close",
        "instances stopped",
        "submit lab (workload.kat)",
        "forget lab/notes",
        "submit lab2 (workload.kat)",
        "forget lab2/db",
        "local cluster stopped",
        &format!("follow {LEADER}"),
        "worker API",
        "retire",
    ];
    let positions: Vec<usize> = order.iter().map(|o| position(&journal, o)).collect();
    assert!(
        positions.windows(2).all(|p| p[0] < p[1]),
        "{order:?} out of order: {journal:#?}"
    );
    assert!(w.script().workloads.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_offer_signed_by_another_clusters_key_is_ignored() {
    let w = world();
    w.script().workloads = vec![workload("lab", "notes")];
    w.start(Duration::from_secs(1));
    w.until("start", Duration::from_secs(5)).await;
    w.script().offers = Some(w.stranger.clone());
    tokio::time::sleep(Duration::from_secs(180)).await;
    assert!(
        !w.journal()
            .iter()
            .any(|l| l.starts_with("probe") || l.starts_with("close")),
        "{:?}",
        w.journal()
    );
    // The parent's own key is taken.
    w.script().offers = Some(w.leader.clone());
    w.until("worker API", Duration::from_secs(10)).await;
}

#[tokio::test(start_paused = true)]
async fn a_refused_workload_is_kept_as_a_bundle_and_a_busy_parent_gets_the_rest_later() {
    let w = world();
    {
        let mut s = w.script();
        s.workloads = vec![workload("lab", "notes"), workload("lab2", "db")];
        s.submit.insert("lab".into(), || {
            refused(StatusCode::CONFLICT, ErrorCode::Conflict)
        });
        s.submit.insert("lab2".into(), || {
            refused(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable)
        });
    }
    w.start(Duration::from_secs(1));
    w.until("start", Duration::from_secs(5)).await;
    w.script().offers = Some(w.leader.clone());
    w.until("local cluster stopped", Duration::from_secs(10))
        .await;
    // The local cluster starts again at once; the next try waits longer.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let journal = w.journal();
    // notes is refused for good: kept, and gone from the local cluster.
    assert!(position(&journal, "forget lab/notes") > position(&journal, "submit lab "));
    let refused_dir = Layout::new(w.dir.path()).rejoin_refused();
    let kept: Vec<_> = std::fs::read_dir(&refused_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].starts_with("lab.notes."), "{kept:?}");
    let bundle = std::fs::read(refused_dir.join(&kept[0])).unwrap();
    assert_eq!(
        kat_api::bundle::unpack(&bundle, &Default::default()).unwrap(),
        workload("lab", "notes").files
    );
    // db is not refused for good: it stays, and the local cluster runs again.
    assert!(
        !journal.iter().any(|l| l == "forget lab2/db"),
        "{journal:#?}"
    );
    assert_eq!(w.script().workloads, vec![workload("lab2", "db")]);
    assert_eq!(
        journal.iter().filter(|l| l.starts_with("start")).count(),
        2,
        "{journal:#?}"
    );
    assert!(!journal.iter().any(|l| l.starts_with("follow")));
    // The parent takes it later: after a longer wait than between requests.
    w.script().submit.clear();
    let failed_at = Instant::now();
    w.until("worker API", Duration::from_secs(60)).await;
    assert!(
        failed_at.elapsed() >= REQUEST_EVERY,
        "{:?}",
        failed_at.elapsed()
    );
    assert!(w.script().workloads.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_refuses_this_node_changes_nothing_and_one_out_of_reach_is_asked_again() {
    let w = world();
    w.script().workloads = vec![workload("lab", "notes")];
    w.script().probes = vec![
        Err(unreachable()),
        Err(refused(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized)),
    ];
    w.start(Duration::from_secs(1));
    w.until("start", Duration::from_secs(5)).await;
    w.script().offers = Some(w.leader.clone());
    w.until("worker API", Duration::from_secs(120)).await;
    let journal = w.journal();
    assert_eq!(
        journal.iter().filter(|l| l.starts_with("probe")).count(),
        3,
        "{journal:#?}"
    );
    // Nothing closed or submitted before the third probe said yes.
    let probes: Vec<usize> = journal
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with("probe"))
        .map(|(i, _)| i)
        .collect();
    assert!(position(&journal, "close") > probes[2], "{journal:#?}");
    assert_eq!(
        journal.iter().filter(|l| l.starts_with("start")).count(),
        1,
        "{journal:#?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_answers_again_without_an_offer_is_rejoined_after_a_while() {
    for lan_down in [false, true] {
        rejoins_directly(lan_down).await;
    }
}

/// With or without a channel for requests, a leader that answers the node's ordinary
/// requests again is rejoined.
async fn rejoins_directly(lan_down: bool) {
    let w = world();
    w.script().lan_down = lan_down;
    w.start(Duration::from_secs(1));
    w.until("start", Duration::from_secs(5)).await;
    // No multicast on this LAN; the leader answers the node's ordinary requests again.
    let contact = w.contact.clone();
    let keep_answering = tokio::spawn(async move {
        loop {
            contact.send_replace(Some(Instant::now()));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let back = Instant::now();
    w.until("worker API", Duration::from_secs(60)).await;
    keep_answering.abort();
    assert!(back.elapsed() >= DIRECT_RETURN, "{:?}", back.elapsed());
}

/// A snapshot of instances `ids`.
fn snapshot(ids: &[&str]) -> Snapshot {
    ids.iter()
        .map(|id| {
            let record: InstanceRecord = serde_json::from_value(serde_json::json!({
                "instanceID": id, "namespace": "default", "workload": "w", "node": "laptop",
                "generation": 1, "specHash": "h", "workloadType": "Service",
                "requests": {"cpuMillis": 0, "memoryBytes": 0, "pids": 0}, "createdAt": "2026-11-24T00:00:00Z"
            }))
            .unwrap();
            (
                record.instance_id.clone(),
                Assignment {
                    record,
                    template: Err("test".into()),
                },
            )
        })
        .collect()
}

type FeedSender = watch::Sender<Option<(Source, Snapshot)>>;

async fn merged(out: &mut watch::Receiver<Option<(Source, Snapshot)>>) -> (Source, Vec<String>) {
    out.changed().await.unwrap();
    let (source, s) = out.borrow_and_update().clone().unwrap();
    (source, s.keys().map(ToString::to_string).collect())
}

fn feeds(
    hold: bool,
) -> (
    FeedSender,
    FeedSender,
    watch::Receiver<Option<(Source, Snapshot)>>,
) {
    let (parent, parent_rx) = watch::channel(None);
    let (local, local_rx) = watch::channel(None);
    let (out, out_rx) = watch::channel(None);
    tokio::spawn(merge_feeds(parent_rx, local_rx, out, hold));
    (parent, local, out_rx)
}

#[tokio::test]
async fn the_local_clusters_instances_join_the_parents_and_leave_with_it() {
    let (parent, local, mut out) = feeds(false);
    parent.send_replace(Some((Source::Store, snapshot(&["p1"]))));
    assert_eq!(
        merged(&mut out).await,
        (Source::Store, vec!["p1".to_string()])
    );
    local.send_replace(Some((Source::Store, snapshot(&["l1"]))));
    assert_eq!(
        merged(&mut out).await,
        (Source::Store, vec!["l1".into(), "p1".into()])
    );
    local.send_replace(None);
    assert_eq!(
        merged(&mut out).await,
        (Source::Store, vec!["p1".to_string()])
    );
}

#[tokio::test]
async fn without_a_parent_snapshot_the_end_of_the_local_cluster_is_an_empty_one() {
    let (_parent, local, mut out) = feeds(false);
    local.send_replace(Some((Source::Store, snapshot(&["l1"]))));
    assert_eq!(merged(&mut out).await.1, vec!["l1".to_string()]);
    local.send_replace(None);
    // Not silence: the supervisor must stop l1.
    assert_eq!(merged(&mut out).await, (Source::Store, vec![]));
}

#[tokio::test]
async fn after_a_restart_while_detached_the_parent_waits_for_the_local_cluster() {
    let (parent, local, mut out) = feeds(true);
    // The parent answers first: its snapshot is only a local copy for now, so the
    // supervisor keeps the local instances' containers.
    parent.send_replace(Some((Source::Store, snapshot(&["p1"]))));
    assert_eq!(
        merged(&mut out).await,
        (Source::LocalCopy, vec!["p1".to_string()])
    );
    local.send_replace(Some((Source::Store, snapshot(&["l1"]))));
    assert_eq!(
        merged(&mut out).await,
        (Source::Store, vec!["l1".into(), "p1".into()])
    );
}
