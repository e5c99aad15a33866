//! Identity and permissions against a nats-server running the config `switchboard
//! nats-config` generates: agents are pinned to their own subjects, a spoofed subject is a
//! permission violation, a spoofed body is `sender_mismatch`, nobody but services publishes
//! into an inbox, no agent touches the JetStream API (it reads through `agent.inbox.fetch`),
//! and a wrong password is refused.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use switchboard_client::{Agent, AgentOptions};
use switchboard_proto::ErrorKind;
use switchboard_proto::send::SendRequest;
use switchboard_runtime::config::Secret;
use switchboard_runtime::permissions::{AgentLogin, Login, UsersFile, nats_config};
use switchboard_testkit::NatsServer;
use switchboard_tests::{assert_no_more, card, next, raw, runtime};
use tokio::sync::mpsc;

const SERVICES: (&str, &str) = ("switchboard", "services-secret");

fn users() -> UsersFile {
    UsersFile {
        services: Login {
            user: SERVICES.0.into(),
            password: SERVICES.1.into(),
        },
        agents: ["alice", "bob"]
            .iter()
            .map(|id| AgentLogin {
                id: (*id).into(),
                password: format!("{id}-secret"),
                audit: *id == "alice",
            })
            .collect(),
    }
}

/// A connection as `user`, with the server's error messages (permission violations) sent to
/// the returned channel.
async fn connect_as(
    url: &str,
    user: &str,
    password: &str,
) -> Result<(async_nats::Client, mpsc::UnboundedReceiver<String>), async_nats::ConnectError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let client = async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                if let async_nats::Event::ServerError(err) = event {
                    let _ = tx.send(err.to_string());
                }
            }
        })
        .connect(url)
        .await?;
    Ok((client, rx))
}

async fn violation(errors: &mut mpsc::UnboundedReceiver<String>, subject: &str) {
    let wanted = format!("Permissions Violation for Publish to \"{subject}\"");
    let found = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(error) = errors.recv().await {
            if error.contains(&wanted) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "no permission violation for {subject}");
}

#[tokio::test]
async fn agents_act_only_as_themselves() {
    let users = users();
    let config = nats_config(&users).unwrap();
    let nats = NatsServer::start_with_config(&config, SERVICES).await;
    let url = nats.url();

    // The services, as the services user.
    let mut settings = runtime(&url);
    settings.nats.user = Some(SERVICES.0.into());
    settings.nats.password = Some(Secret::new(SERVICES.1));
    let services = switchboard_runtime::nats::connect(&settings.nats, "services")
        .await
        .unwrap();
    let shutdown = switchboard_runtime::CancellationToken::new();
    let directory = directory::start(&services, &settings, Default::default())
        .await
        .unwrap();
    let fanout = inbox_fanout::start(&services, &settings, Default::default())
        .await
        .unwrap();
    let correlator = reply_correlator::start(&services, &settings, Default::default())
        .await
        .unwrap();
    tokio::spawn(directory.run(shutdown.clone()));
    tokio::spawn(fanout.run(shutdown.clone()));
    tokio::spawn(correlator.run(shutdown.clone()));

    // Agents, each as itself: the ordinary traffic works.
    let (alice_nats, mut alice_errors) = connect_as(&url, "alice", "alice-secret").await.unwrap();
    let (bob_nats, _bob_errors) = connect_as(&url, "bob", "bob-secret").await.unwrap();
    let options = AgentOptions::default();
    let alice = Agent::connect_with(alice_nats.clone(), card("alice"), options.clone())
        .await
        .unwrap();
    let bob = Agent::connect_with(bob_nats, card("bob"), options)
        .await
        .unwrap();
    let alice_goal = alice.open_goal().await.unwrap();
    let bob_goal = bob.open_goal().await.unwrap();
    alice.send_to_peer("bob", "hello bob").await.unwrap();
    assert_eq!(next(&bob_goal).await.body, "hello bob");
    assert_eq!(alice.peers().await.unwrap().peers.len(), 1);

    // A spoofed subject: alice publishing bob's send request is refused by the server.
    let spoofed = tokio::time::timeout(
        Duration::from_secs(1),
        alice_nats.request(
            "agent.send.bob",
            serde_json::to_vec(&serde_json::json!({"to": "alice", "message": "I am bob"}))
                .unwrap()
                .into(),
        ),
    )
    .await;
    assert!(
        !matches!(spoofed, Ok(Ok(_))),
        "no service may see it: {spoofed:?}"
    );
    violation(&mut alice_errors, "agent.send.bob").await;
    assert_no_more(&alice_goal).await;

    // A spoofed body: the service refuses a `from_agent_id` that is not the subject's.
    let err = alice
        .send(SendRequest {
            to: Some("bob".into()),
            message: Some("from bob, honestly".into()),
            from_agent_id: Some("bob".into()),
            ..SendRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::SenderMismatch));
    let call = raw(
        &alice_nats,
        "agent.call.alice",
        r#"{"to":"bob","message":"?","from_agent_id":"bob","wait":false}"#,
    )
    .await;
    assert_eq!(call.error_kind(), "sender_mismatch");
    assert_no_more(&bob_goal).await;

    // Nobody but the services writes into an inbox, not even one's own.
    for goal in [bob_goal.id(), alice_goal.id()] {
        let subject = format!("agent.inbox.{goal}");
        alice_nats
            .publish(subject.clone(), "forged".into())
            .await
            .unwrap();
        violation(&mut alice_errors, &subject).await;
    }
    assert_no_more(&bob_goal).await;
    // Nor into the service-internal or event subjects, nor the JetStream API at all (agents
    // read through agent.inbox.fetch/ack), nor another agent's inbox reads.
    let pull = format!(
        "$JS.API.CONSUMER.MSG.NEXT.AGENT_INBOX.inbox-{}",
        bob_goal.id()
    );
    for subject in [
        "_SB.calls.answer.00000000-0000-0000-0000-000000000000",
        "agent.registry.events.offline.bob",
        "$JS.API.STREAM.INFO.AGENT_INBOX",
        "$JS.API.STREAM.DELETE.AGENT_AUDIT",
        pull.as_str(),
        "$JS.ACK.AGENT_INBOX.x.1.1.1.1.1",
        "agent.inbox.fetch.bob",
        "agent.inbox.ack.bob",
    ] {
        alice_nats
            .publish(subject.to_owned(), "x".into())
            .await
            .unwrap();
        violation(&mut alice_errors, subject).await;
    }
    // alice may query the audit (her file says so); bob may not.
    let (bob_raw, mut bob_errors) = connect_as(&url, "bob", "bob-secret").await.unwrap();
    bob_raw
        .publish("agent.audit.history", "{}".into())
        .await
        .unwrap();
    violation(&mut bob_errors, "agent.audit.history").await;

    // A wrong password, or an agent claiming the services user, is refused.
    assert!(connect_as(&url, "alice", "wrong").await.is_err());
    assert!(connect_as(&url, SERVICES.0, "alice-secret").await.is_err());
    assert!(connect_as(&url, "mallory", "anything").await.is_err());
    shutdown.cancel();
}
