//! `katcall get ingress`: the routes the cluster's ingress serves, one owner per host and
//! path (the workload that claimed it first). An ingress token reads this and nothing else.

use anyhow::Result;

use crate::client::Client;
use crate::output::{self, structured, Format};

pub async fn list(client: &Client, format: Format) -> Result<()> {
    let routes = client.ingress_routes().await?;
    if structured(format, &routes)? {
        return Ok(());
    }
    if routes.is_empty() {
        eprintln!("no ingress routes (a VirtualLoadBalancer's spec.ingress makes one)");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = routes
        .iter()
        .map(|r| {
            vec![
                r.host.clone(),
                r.path.clone(),
                format!("{}/{}", r.namespace, r.workload),
                r.upstream.clone(),
                if r.tls { "yes" } else { "no" }.into(),
            ]
        })
        .collect();
    print!(
        "{}",
        output::table(&["HOST", "PATH", "WORKLOAD", "UPSTREAM", "TLS"], &rows)
    );
    Ok(())
}
