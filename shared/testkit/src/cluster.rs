//! [`NatsCluster`]: an n-node JetStream cluster on loopback (tests use three) whose nodes can
//! be crashed, stopped cleanly, frozen and restarted, and [`create_stream`], which rides out the
//! moment a fresh cluster refuses stream placement.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_nats::jetstream;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::process::Child;
use tokio::time::{Instant, sleep};

use crate::POLL_INTERVAL;
use crate::login::Login;
use crate::paths::nats_server_bin;
use crate::spawn::{
    LOG_TAIL_LINES, check_alive, connect, free_ports, kill_blocking, log_tail, quote,
    readiness_panic, signal, spawn_server, temp_dir, unique_name, wait_jetstream,
};

/// How long [`NatsCluster`] waits for its nodes (and a meta leader).
const READY_TIMEOUT_CLUSTER: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Node {
    name: String,
    port: u16,
    http_port: u16,
    config: PathBuf,
    log_path: PathBuf,
    store_dir: PathBuf,
    child: Option<Child>,
}

/// An n-node JetStream cluster on loopback. Node `i` has its own config file,
/// temp store dir and log file; all processes are killed on drop.
#[derive(Debug)]
pub struct NatsCluster {
    nodes: Vec<Node>,
    bin: PathBuf,
    // Declared last, and `Drop` kills the processes first.
    _dir: tempfile::TempDir,
}

impl NatsCluster {
    /// Starts `nodes` servers routed to each other as one JetStream cluster
    /// and waits (at most 30 s) until every node accepts connections, is
    /// healthy, and answers JetStream API requests (which needs a meta leader).
    ///
    /// # Panics
    /// If `nodes` is 0, the binary is missing, or the cluster does not become
    /// ready (the message includes the tail of the failing node's log).
    pub async fn start(nodes: usize) -> NatsCluster {
        assert!(nodes > 0, "testkit: a NatsCluster needs at least one node");
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            let mut cluster = Self::spawn(nodes);
            let deadline = Instant::now() + READY_TIMEOUT_CLUSTER;
            let mut failure = None;
            for node in 0..nodes {
                if let Err(e) = cluster.wait_node(node, deadline).await {
                    failure = Some(e);
                    break;
                }
            }
            if failure.is_none()
                && let Err(reason) = cluster.wait_placement(deadline).await
            {
                failure = Some((0, reason));
            }
            let Some((node, reason)) = failure else {
                return cluster;
            };
            let log_path = cluster.nodes[node].log_path.clone();
            // Ports are picked then released before the servers bind them, so
            // another process may grab one in between: retry with new ports.
            if attempt < ATTEMPTS
                && log_tail(&log_path, LOG_TAIL_LINES).contains("address already in use")
            {
                continue;
            }
            let what = format!("cluster node {node} ({})", cluster.nodes[node].name);
            readiness_panic(&what, &reason, &log_path);
        }
        unreachable!("the last attempt either returns or panics")
    }

    /// `nats://127.0.0.1:<port>` of node `node`.
    pub fn url(&self, node: usize) -> String {
        format!("nats://127.0.0.1:{}", self.node(node).port)
    }

    /// The URLs of all nodes, in node order.
    pub fn urls(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|i| self.url(i)).collect()
    }

    /// A new client connected to node `node` (default options, so it may
    /// fail over to other nodes it learns about).
    ///
    /// # Panics
    /// If the connection fails (e.g. the node is stopped).
    pub async fn client(&self, node: usize) -> async_nats::Client {
        connect(&self.url(node), &Login::Open).await
    }

    /// Kills node `node` (SIGKILL, like a crash) and waits for it to exit.
    /// Does nothing if it is already stopped.
    pub async fn stop_node(&mut self, node: usize) {
        if let Some(mut child) = self.node_mut(node).child.take() {
            let _ = child.kill().await;
        }
    }

    /// Stops node `node` with SIGTERM (a clean shutdown, as an orchestrator stops a pod) and
    /// waits (at most 30 s, then SIGKILL) for it to exit. Does nothing if it is stopped.
    pub async fn terminate_node(&mut self, node: usize) {
        if let Some(mut child) = self.node_mut(node).child.take() {
            if let Some(pid) = child.id() {
                signal(pid, "TERM");
            }
            if tokio::time::timeout(Duration::from_secs(30), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }

    /// Freezes node `node` (SIGSTOP): its process and connections stay open but nothing is
    /// answered — a hung machine, not a crashed one. Undo with [`NatsCluster::resume_node`].
    pub fn pause_node(&self, node: usize) {
        if let Some(pid) = self.node(node).child.as_ref().and_then(Child::id) {
            signal(pid, "STOP");
        }
    }

    /// Lets a paused node run again (SIGCONT) and waits (at most 30 s) until it is healthy
    /// again and streams can be placed on every node.
    ///
    /// # Panics
    /// If the node does not recover in time.
    pub async fn resume_node(&mut self, node: usize) {
        if let Some(pid) = self.node(node).child.as_ref().and_then(Child::id) {
            signal(pid, "CONT");
        }
        let deadline = Instant::now() + READY_TIMEOUT_CLUSTER;
        let ready = match self.wait_node(node, deadline).await {
            Ok(()) => self.wait_placement(deadline).await,
            Err((_, reason)) => Err(reason),
        };
        if let Err(reason) = ready {
            let n = self.node(node);
            readiness_panic(
                &format!("cluster node {node} ({})", n.name),
                &reason,
                &n.log_path,
            );
        }
    }

    /// Starts node `node` again with the same ports and store, and waits (at
    /// most 30 s) until it answers, is healthy (caught up), and JetStream API
    /// requests through it succeed (a meta leader exists). Does nothing if it
    /// is running.
    ///
    /// # Panics
    /// If the node does not become ready in time.
    pub async fn start_node(&mut self, node: usize) {
        if self.node(node).child.is_some() {
            return;
        }
        let deadline = Instant::now() + READY_TIMEOUT_CLUSTER;
        let n = self.node(node);
        let child = spawn_server(
            &self.bin,
            &["-c".into(), n.config.clone().into()],
            &n.log_path,
        );
        self.node_mut(node).child = Some(child);
        if let Err((failed, reason)) = self.wait_node(node, deadline).await {
            let n = self.node(failed);
            readiness_panic(
                &format!("cluster node {failed} ({})", n.name),
                &reason,
                &n.log_path,
            );
        }
        if self.nodes.iter().all(|n| n.child.is_some())
            && let Err(reason) = self.wait_placement(deadline).await
        {
            let n = self.node(node);
            readiness_panic(
                &format!("cluster node {node} ({})", n.name),
                &reason,
                &n.log_path,
            );
        }
    }

    /// Waits (at most 30 s) until the cluster has settled after a fault: every stream (KV
    /// buckets included) has a leader and every replica of it is current, and every consumer
    /// has a leader. A node answering `/healthz` is not enough: the streams it led elect new
    /// leaders only after nats-server's 4–9 s election timeout, and taking down another node
    /// before then leaves those streams without a quorum until the first node catches up. A
    /// rolling restart waits for this before it takes the next node down.
    ///
    /// # Panics
    /// If the cluster has not settled in time (the message names what is still unsettled).
    pub async fn wait_settled(&self) {
        let deadline = Instant::now() + READY_TIMEOUT_CLUSTER;
        let js = jetstream::new(connect(&self.url(0), &Login::Open).await);
        loop {
            let unsettled = match unsettled(&js).await {
                Ok(unsettled) if unsettled.is_empty() => return,
                Ok(unsettled) => unsettled.join(", "),
                Err(err) => err,
            };
            assert!(
                Instant::now() < deadline,
                "testkit: the cluster did not settle in {READY_TIMEOUT_CLUSTER:?}: {unsettled}"
            );
            sleep(POLL_INTERVAL).await;
        }
    }

    /// Waits until the meta leader can place a stream on every node: every node answering
    /// is not enough, since the leader may not yet count a (re)started peer as online, and
    /// creating an R`n` stream then fails with "no suitable peers for placement". A probe
    /// stream with `n` file replicas (what tests create) is created (retried until it works)
    /// and deleted.
    ///
    /// Even then the leader may refuse placement as "peer offline" for a moment (about 100 ms,
    /// about 1 s after start-up, once in ~40 starts here; not visible in `/jsz`): tests that
    /// create replicated streams themselves use [`create_stream`], and the services retry.
    async fn wait_placement(&self, deadline: Instant) -> Result<(), String> {
        const PROBE: &str = "SB_TESTKIT_PLACEMENT_PROBE";
        let client = connect(&self.url(0), &Login::Open).await;
        let js = jetstream::new(client);
        loop {
            let config = jetstream::stream::Config {
                name: PROBE.to_owned(),
                subjects: vec!["_sb_testkit.placement_probe".to_owned()],
                num_replicas: self.nodes.len(),
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            };
            let last = match js.create_stream(config).await {
                Ok(_) => {
                    let _ = js.delete_stream(PROBE).await;
                    return Ok(());
                }
                Err(err) => err.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(format!("streams cannot be placed on all nodes: {last}"));
            }
            sleep(Duration::from_millis(100)).await;
        }
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no nodes (never true: `start` needs one).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The log file of node `node` (all its runs appended).
    pub fn log_path(&self, node: usize) -> &Path {
        &self.node(node).log_path
    }

    /// The JetStream store dir of node `node`.
    pub fn store_dir(&self, node: usize) -> &Path {
        &self.node(node).store_dir
    }

    fn node(&self, node: usize) -> &Node {
        let len = self.nodes.len();
        self.nodes
            .get(node)
            .unwrap_or_else(|| panic!("testkit: no node {node} in a {len}-node cluster"))
    }

    fn node_mut(&mut self, node: usize) -> &mut Node {
        let len = self.nodes.len();
        self.nodes
            .get_mut(node)
            .unwrap_or_else(|| panic!("testkit: no node {node} in a {len}-node cluster"))
    }

    /// Writes the configs and spawns every node (no waiting).
    fn spawn(nodes: usize) -> NatsCluster {
        let bin = nats_server_bin();
        let dir = temp_dir("sb-nats-cluster-");
        let cluster_name = unique_name("cluster");
        let ports = free_ports(nodes * 3);
        let (client_ports, rest) = ports.split_at(nodes);
        let (cluster_ports, http_ports) = rest.split_at(nodes);

        let mut list = Vec::with_capacity(nodes);
        for i in 0..nodes {
            let node_dir = dir.path().join(format!("n{i}"));
            fs::create_dir_all(&node_dir).expect("testkit: cannot create a node dir");
            let name = format!("{cluster_name}-n{i}");
            let store_dir = node_dir.join("store");
            let routes: Vec<String> = (0..nodes)
                .filter(|&j| j != i)
                .map(|j| quote(&format!("nats-route://127.0.0.1:{}", cluster_ports[j])))
                .collect();
            let config = format!(
                "server_name: {name}\n\
                 listen: {listen}\n\
                 http: {http}\n\
                 jetstream {{\n  store_dir: {store}\n  sync_interval: always\n}}\n\
                 cluster {{\n  name: {cluster}\n  listen: {cluster_listen}\n  routes: [\n    {routes}\n  ]\n}}\n",
                name = quote(&name),
                listen = quote(&format!("127.0.0.1:{}", client_ports[i])),
                http = quote(&format!("127.0.0.1:{}", http_ports[i])),
                store = quote(&store_dir.to_string_lossy()),
                cluster = quote(&cluster_name),
                cluster_listen = quote(&format!("127.0.0.1:{}", cluster_ports[i])),
                routes = routes.join("\n    "),
            );
            let config_path = node_dir.join("nats-server.conf");
            fs::write(&config_path, config).expect("testkit: cannot write a node config");
            list.push(Node {
                name,
                port: client_ports[i],
                http_port: http_ports[i],
                config: config_path,
                log_path: node_dir.join("nats-server.log"),
                store_dir,
                child: None,
            });
        }
        for node in &mut list {
            node.child = Some(spawn_server(
                &bin,
                &["-c".into(), node.config.clone().into()],
                &node.log_path,
            ));
        }
        NatsCluster {
            nodes: list,
            bin,
            _dir: dir,
        }
    }

    /// Waits until node `node` is healthy and answers JetStream API requests.
    /// On failure returns the node to blame (a crashed one, or `node`) and why.
    async fn wait_node(&mut self, node: usize, deadline: Instant) -> Result<(), (usize, String)> {
        let url = self.url(node);
        let http_port = self.node(node).http_port;
        let nodes = &mut self.nodes;
        let mut crashed = None;
        let mut alive = || {
            for (i, n) in nodes.iter_mut().enumerate() {
                if let Some(child) = n.child.as_mut()
                    && let Err(e) = check_alive(child)
                {
                    crashed = Some(i);
                    return Err(e);
                }
            }
            Ok(())
        };
        let result = wait_jetstream(&url, &Login::Open, deadline, &mut alive).await;
        // `/healthz` is 200 once the node's JetStream is current (it has a meta
        // leader and its streams and consumers have caught up).
        let result = match result {
            Ok(()) => loop {
                if let Err(e) = alive() {
                    break Err(e);
                }
                let last = match http_get(http_port, "/healthz").await {
                    Ok((200, _)) => break Ok(()),
                    Ok((status, body)) => format!("/healthz answered {status}: {body}"),
                    Err(e) => e,
                };
                if Instant::now() >= deadline {
                    break Err(format!("timed out; last error: {last}"));
                }
                sleep(POLL_INTERVAL).await;
            },
            Err(e) => Err(e),
        };
        result.map_err(|e| (crashed.unwrap_or(node), e))
    }
}

/// Status code and body of `GET path` on the monitoring port.
async fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let request = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(1), request)
        .await
        .map_err(|_| format!("GET {path} on port {port} timed out"))?
        .map_err(|e| format!("GET {path} on port {port}: {e}"))?;
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("GET {path} on port {port}: bad response {text:?}"))?;
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or("")
        .trim()
        .to_owned();
    Ok((status, body))
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(child) = node.child.as_mut() {
                let _ = child.start_kill();
            }
        }
        for node in &mut self.nodes {
            if let Some(child) = node.child.as_mut() {
                kill_blocking(child);
            }
        }
    }
}

/// Creates a stream as a careful client would on a cluster: a cluster that has just formed (or
/// had a node restarted) refuses placement as "no suitable peers for placement, peer offline"
/// for a moment (about 100 ms, seen about 1 s after start-up, after every readiness check
/// passed), so that refusal is retried for at most 10 s. Any other error is returned at once.
///
/// # Errors
/// What JetStream answered last.
pub async fn create_stream(
    js: &jetstream::Context,
    config: jetstream::stream::Config,
) -> Result<jetstream::stream::Stream, jetstream::context::CreateStreamError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match js.create_stream(config.clone()).await {
            Err(err)
                if Instant::now() < deadline
                    && matches!(
                        err.kind(),
                        jetstream::context::CreateStreamErrorKind::JetStream(api)
                            if api.error_code() == jetstream::ErrorCode::CLUSTER_NO_PEERS
                                && api.to_string().contains("offline")
                    ) =>
            {
                sleep(Duration::from_millis(50)).await;
            }
            done => return done,
        }
    }
}

/// What is not settled yet (see [`NatsCluster::wait_settled`]): streams without a leader or
/// with a replica behind, consumers without a leader. `Err` when the listing itself failed
/// (no meta leader yet).
async fn unsettled(js: &jetstream::Context) -> Result<Vec<String>, String> {
    use futures::TryStreamExt as _;
    let streams: Vec<jetstream::stream::Info> = js
        .streams()
        .try_collect()
        .await
        .map_err(|err| format!("listing streams: {err}"))?;
    let mut unsettled = Vec::new();
    for info in streams {
        let name = info.config.name.clone();
        let Some(cluster) = info.cluster.as_ref() else {
            continue;
        };
        if cluster.leader.is_none() {
            unsettled.push(format!("stream {name} has no leader"));
            continue;
        }
        if let Some(behind) = cluster.replicas.iter().find(|r| !r.current || r.offline) {
            unsettled.push(format!("stream {name}: replica {} behind", behind.name));
            continue;
        }
        let stream = js
            .get_stream(&name)
            .await
            .map_err(|err| format!("stream {name}: {err}"))?;
        let consumers: Vec<jetstream::consumer::Info> = stream
            .consumers()
            .try_collect()
            .await
            .map_err(|err| format!("listing consumers of {name}: {err}"))?;
        for consumer in consumers {
            if consumer
                .cluster
                .as_ref()
                .is_some_and(|c| c.leader.is_none())
            {
                unsettled.push(format!("consumer {name}/{} has no leader", consumer.name));
            }
        }
    }
    Ok(unsettled)
}
