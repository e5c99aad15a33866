//! A nats-server with the four request services, and agents registered on it.

use std::time::Duration;

use switchboard_client::{Agent, AgentOptions};
use switchboard_proto::{AgentCard, AgentId};
use tokio::task::JoinHandle;

use crate::services::{Replica, Service, fast_calls, fast_tasks, runtime};

/// A nats-server with all four request services: directory, inbox-fanout, reply-correlator
/// and task-lifecycle.
pub struct Fabric {
    pub nats: switchboard_testkit::NatsServer,
    pub directory: Replica,
    pub fanout: Replica,
    pub correlator: Replica,
    /// `None` after [`Fabric::stop_tasks`].
    pub tasks: Option<Replica>,
}

impl Fabric {
    pub async fn start() -> Self {
        Self::start_with(inbox_fanout::FanoutConfig::default()).await
    }

    pub async fn start_with(config: inbox_fanout::FanoutConfig) -> Self {
        Self::start_full(config, fast_calls()).await
    }

    pub async fn start_full(
        fanout: inbox_fanout::FanoutConfig,
        calls: reply_correlator::CorrelatorConfig,
    ) -> Self {
        Self::start_all(fanout, calls, fast_tasks()).await
    }

    /// Default fan-out and calls, these task settings.
    pub async fn start_tasks_with(tasks: task_lifecycle::TaskConfig) -> Self {
        Self::start_all(Default::default(), fast_calls(), tasks).await
    }

    pub async fn start_all(
        fanout: inbox_fanout::FanoutConfig,
        calls: reply_correlator::CorrelatorConfig,
        tasks: task_lifecycle::TaskConfig,
    ) -> Self {
        Self::assemble(Default::default(), fanout, calls, tasks).await
    }

    /// Default fan-out, calls and tasks, these directory settings (e.g.
    /// [`fast_offline`](crate::fast_offline)).
    pub async fn start_directory_with(directory: directory::DirectoryConfig) -> Self {
        Self::assemble(directory, Default::default(), fast_calls(), fast_tasks()).await
    }

    async fn assemble(
        directory: directory::DirectoryConfig,
        fanout: inbox_fanout::FanoutConfig,
        calls: reply_correlator::CorrelatorConfig,
        tasks: task_lifecycle::TaskConfig,
    ) -> Self {
        let nats = switchboard_testkit::NatsServer::start().await;
        let runtime = runtime(&nats.url());
        let directory = Service::Directory(directory).start(&runtime).await;
        let fanout = Service::Fanout(fanout).start(&runtime).await;
        let correlator = Service::Correlator(calls).start(&runtime).await;
        let tasks = Some(Service::Tasks(tasks).start(&runtime).await);
        Self {
            nats,
            directory,
            fanout,
            correlator,
            tasks,
        }
    }

    /// Stops the fabric's task-lifecycle replica.
    pub async fn stop_tasks(&mut self) {
        if let Some(tasks) = self.tasks.take() {
            tasks.stop().await;
        }
    }

    pub fn url(&self) -> String {
        self.nats.url()
    }

    /// A registered agent (open ACLs, no automatic heartbeats during a test).
    pub async fn agent(&self, id: &str) -> Agent {
        agent_with(&self.url(), card(id), Duration::from_secs(3600)).await
    }

    /// A registered agent with one open goal.
    pub async fn agent_with_goal(&self, id: &str) -> (Agent, switchboard_client::Goal) {
        let agent = self.agent(id).await;
        let goal = agent.open_goal().await.unwrap();
        (agent, goal)
    }

    /// An agent with one goal whose runtime answers every call request with `answer(body)`,
    /// serving each request in its call's scope (so calls it makes name their parent).
    pub async fn answering(
        &self,
        id: &str,
        answer: impl Fn(String) -> String + Send + Sync + 'static,
    ) -> (std::sync::Arc<Agent>, JoinHandle<()>) {
        let agent = std::sync::Arc::new(self.agent(id).await);
        let goal = agent.open_goal().await.unwrap();
        let me = std::sync::Arc::clone(&agent);
        let task = tokio::spawn(async move {
            loop {
                let Ok(Some(delivery)) = goal.recv(Duration::from_secs(60)).await else {
                    continue;
                };
                let message = delivery.ack().await.unwrap();
                if message.kind == switchboard_proto::MessageKind::Request
                    && let Some(correlation_id) = message.correlation_id
                {
                    let text = answer(message.body.clone());
                    let _ = me.reply(correlation_id, &text).await;
                }
            }
        });
        (agent, task)
    }

    /// Messages stored in AGENT_INBOX right now.
    pub async fn stored(&self) -> u64 {
        let js = async_nats::jetstream::new(self.nats.client().await);
        let mut stream = js
            .get_stream(switchboard_proto::INBOX_STREAM)
            .await
            .unwrap();
        stream.info().await.unwrap().state.messages
    }
}

/// An agent connected to one node of a cluster at `url` (waiting for it if it is not up yet),
/// with a 5 s request timeout so a request lost with a killed node is retried soon, and no
/// heartbeats during the test.
pub async fn agent_on(url: &str, id: &str) -> Agent {
    let nats = switchboard_client::agent_connect_options(&AgentId::parse(id).unwrap())
        .retry_on_initial_connect()
        .connect(url)
        .await
        .unwrap();
    let options = AgentOptions {
        heartbeat_interval: Duration::from_secs(3600),
        request_timeout: Duration::from_secs(5),
        ..AgentOptions::default()
    };
    Agent::connect_with(nats, card(id), options).await.unwrap()
}

/// Connects an agent with a given card (heartbeats every `beat`).
pub async fn agent_with(url: &str, card: AgentCard, beat: Duration) -> Agent {
    let nats = switchboard_client::agent_connect_options(&card.agent_id)
        .connect(url)
        .await
        .unwrap();
    let options = AgentOptions {
        heartbeat_interval: beat,
        ..AgentOptions::default()
    };
    Agent::connect_with(nats, card, options).await.unwrap()
}

/// A card with open ACLs.
pub fn card(id: &str) -> AgentCard {
    AgentCard::new(AgentId::parse(id).unwrap())
}
