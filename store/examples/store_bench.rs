//! Store benchmark: puts per second and watch latency, MemStore and EtcdStore in one run.
//!
//! Starts its own etcd (through `EtcdServer`) in a temporary directory. Prints one line per
//! figure and a last line that `bench/store.sh` and docs/benchmarks.md quote:
//! `store_puts_per_s mem=X etcd=Y raw_etcd_client=P etcd/raw=R etcd_batched=Z watch_p50_us mem=A etcd=B watch_p99_us mem=C etcd=D`

use std::sync::Arc;
use std::time::Instant;

use kat_store::*;

const PUTS: usize = 20_000;
const CONCURRENCY: usize = 16;
const LATENCY_SAMPLES: usize = 2_000;

async fn puts_per_second(store: Arc<dyn StateStore>, prefix: &str, n: usize) -> f64 {
    let start = Instant::now();
    let per_task = n / CONCURRENCY;
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|t| {
            let store = store.clone();
            let prefix = prefix.to_string();
            tokio::spawn(async move {
                for i in 0..per_task {
                    store
                        .put(&format!("{prefix}{t}/{i}"), vec![b'x'; 256], None)
                        .await
                        .expect("put");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("writer");
    }
    (per_task * CONCURRENCY) as f64 / start.elapsed().as_secs_f64()
}

/// The peer: the same puts through `etcd-client` directly, without our StateStore layer.
async fn raw_client_puts_per_second(endpoint: &str, prefix: &str, n: usize) -> f64 {
    let client = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("connect");
    let start = Instant::now();
    let per_task = n / CONCURRENCY;
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|t| {
            let mut kv = client.kv_client();
            let prefix = prefix.to_string();
            tokio::spawn(async move {
                for i in 0..per_task {
                    kv.put(format!("{prefix}{t}/{i}"), vec![b'x'; 256], None)
                        .await
                        .expect("put");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("writer");
    }
    (per_task * CONCURRENCY) as f64 / start.elapsed().as_secs_f64()
}

/// Writes in transactions of MAX_TXN_OPS puts, as the scheduler will batch placements.
async fn batched_puts_per_second(store: Arc<dyn StateStore>, prefix: &str, n: usize) -> f64 {
    let start = Instant::now();
    let batches = n / MAX_TXN_OPS;
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|t| {
            let store = store.clone();
            let prefix = prefix.to_string();
            tokio::spawn(async move {
                for b in (t..batches).step_by(CONCURRENCY) {
                    let ops = (0..MAX_TXN_OPS)
                        .map(|i| TxnOp::put(format!("{prefix}{b}/{i}"), vec![b'x'; 256]));
                    store.txn(Txn::new().and_then(ops)).await.expect("txn");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("writer");
    }
    (batches * MAX_TXN_OPS) as f64 / start.elapsed().as_secs_f64()
}

/// Time from a put returning to its event arriving at a watcher: (p50, p99) in µs.
async fn watch_latency_us(store: Arc<dyn StateStore>, prefix: &str) -> (u128, u128) {
    let mut watch = store
        .watch(prefix, WatchOptions::prefix())
        .await
        .expect("watch");
    let mut samples = Vec::with_capacity(LATENCY_SAMPLES);
    for i in 0..LATENCY_SAMPLES {
        let sent = Instant::now();
        store
            .put(&format!("{prefix}{i}"), b"v".to_vec(), None)
            .await
            .expect("put");
        watch.next().await.expect("open").expect("event");
        samples.push(sent.elapsed().as_micros());
    }
    samples.sort_unstable();
    (
        samples[samples.len() / 2],
        samples[samples.len() * 99 / 100],
    )
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = EtcdServerConfig::loopback("bench", dir.path()).expect("free ports");
    let server = EtcdServer::start(config).await.expect("start etcd");
    let etcd: Arc<dyn StateStore> = Arc::new(
        EtcdStore::connect(&[server.client_url().to_string()], None)
            .await
            .expect("connect"),
    );
    let mem: Arc<dyn StateStore> = Arc::new(MemStore::new());

    let mem_puts = puts_per_second(mem.clone(), "/bench/puts/", PUTS * 10).await;
    println!("mem   puts/s (concurrency {CONCURRENCY}): {mem_puts:.0}");
    let etcd_puts = puts_per_second(etcd.clone(), "/bench/puts/", PUTS).await;
    println!("etcd  puts/s (concurrency {CONCURRENCY}): {etcd_puts:.0}");
    let raw_puts = raw_client_puts_per_second(server.client_url(), "/bench/raw/", PUTS).await;
    println!("peer: raw etcd-client puts/s (concurrency {CONCURRENCY}): {raw_puts:.0}; EtcdStore/raw = {:.2}", etcd_puts / raw_puts);
    let etcd_batched = batched_puts_per_second(etcd.clone(), "/bench/batched/", PUTS * 2).await;
    println!("etcd  puts/s in {MAX_TXN_OPS}-op transactions: {etcd_batched:.0}");
    let (mem_p50, mem_p99) = watch_latency_us(mem.clone(), "/bench/watch/").await;
    println!("mem   watch latency p50={mem_p50}us p99={mem_p99}us");
    let (etcd_p50, etcd_p99) = watch_latency_us(etcd.clone(), "/bench/watch/").await;
    println!("etcd  watch latency p50={etcd_p50}us p99={etcd_p99}us");
    println!("mem/etcd puts ratio: {:.1}x", mem_puts / etcd_puts);
    server.stop().await;
    println!(
        "store_puts_per_s mem={mem_puts:.0} etcd={etcd_puts:.0} raw_etcd_client={raw_puts:.0} etcd/raw={:.2} etcd_batched={etcd_batched:.0} watch_p50_us mem={mem_p50} etcd={etcd_p50} watch_p99_us mem={mem_p99} etcd={etcd_p99}",
        etcd_puts / raw_puts
    );
}
