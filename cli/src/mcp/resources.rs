//! The one MCP resource, the inbox (`switchboard://inbox`: how many peer messages wait
//! unread), and how new messages are announced: a resource update for hosts that subscribed,
//! and a log notification for hosts that show logs.

use std::sync::atomic::Ordering;
use std::time::Duration;

use rmcp::model::{
    ListResourcesResult, ReadResourceResponse, ReadResourceResult, Resource, ResourceContents,
    ResourceUpdatedNotificationParam,
};
#[allow(deprecated)] // logging is deprecated by SEP-2577, but hosts still show log messages
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::{ErrorData, Peer, RoleServer};
use switchboard_client::Goal;

use super::SwitchboardMcp;

/// The resource that tracks the inbox: subscribe to it to hear of new messages.
pub(super) const INBOX_RESOURCE: &str = "switchboard://inbox";

/// The resources this server offers: the inbox.
pub(super) fn list() -> ListResourcesResult {
    ListResourcesResult::with_all_items(vec![
        Resource::new(INBOX_RESOURCE, "inbox")
            .with_description(
                "How many peer messages wait unread in this session's inbox (subscribe to \
                 hear when it grows; read them with check_inbox)",
            )
            .with_mime_type("application/json"),
    ])
}

/// `Err(resource not found)` unless `uri` names the inbox.
fn inbox_only(uri: &str) -> Result<(), ErrorData> {
    if uri != INBOX_RESOURCE {
        return Err(ErrorData::resource_not_found(
            format!("no resource {uri}; there is {INBOX_RESOURCE}"),
            None,
        ));
    }
    Ok(())
}

impl SwitchboardMcp {
    /// `resources/read`: this session's agent, goal and unread count.
    pub(super) async fn read_inbox(&self, uri: &str) -> Result<ReadResourceResponse, ErrorData> {
        inbox_only(uri)?;
        let waiting = self
            .goal
            .waiting()
            .await
            .map_err(|err| ErrorData::internal_error(err.to_string(), None))?;
        let body = serde_json::json!({
            "agent_id": self.agent.id(),
            "goal_id": self.goal.id(),
            "waiting": waiting,
        });
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(body.to_string(), INBOX_RESOURCE)
                .with_mime_type("application/json"),
        ])
        .into())
    }

    /// `resources/subscribe`: new messages are announced as updates of the inbox resource.
    pub(super) fn subscribe_inbox(&self, uri: &str) -> Result<(), ErrorData> {
        inbox_only(uri)?;
        self.subscribed.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// `resources/unsubscribe`: no more resource updates (the log notifications go on).
    pub(super) fn unsubscribe_inbox(&self) {
        self.subscribed.store(false, Ordering::Relaxed);
    }
}

/// Tells the host when messages arrive (they stay unread until `check_inbox`):
/// `notifications/resources/updated` for [`INBOX_RESOURCE`] when the host subscribed to it, and a
/// `notifications/message` log entry (logger `switchboard`, `data.event = "inbox"`, with the
/// unread count) for hosts that show logs.
///
/// What is unread is looked at (a peek: nothing is handed out) every [`ANNOUNCE_EVERY`]: more
/// unread messages than last time, or another oldest one with some unread, means new ones
/// arrived, announced once; messages that arrived before the session started are announced at
/// start. An agent cannot subscribe to inbox subjects (docs/security.md), so it asks.
pub(super) async fn announce_new_messages(server: SwitchboardMcp, peer: Peer<RoleServer>) {
    let goal = server.goal.clone();
    let mut seen = (0, None);
    loop {
        match goal.unread().await {
            Ok(now) => {
                let (waiting, oldest) = now;
                let arrived = waiting > seen.0 || (waiting > 0 && oldest != seen.1);
                if arrived && !announce(&server, &peer, &goal, waiting).await {
                    return; // the session is gone
                }
                seen = now;
            }
            Err(err) => tracing::debug!(error = %err, "counting unread messages failed"),
        }
        tokio::time::sleep(ANNOUNCE_EVERY).await;
    }
}

/// How often the unread count is looked at for announcements.
const ANNOUNCE_EVERY: Duration = Duration::from_millis(250);

/// Sends the notifications for `waiting` unread messages; false once the host is gone.
#[allow(deprecated)] // logging: see the import
async fn announce(
    server: &SwitchboardMcp,
    peer: &Peer<RoleServer>,
    goal: &Goal,
    waiting: u64,
) -> bool {
    if server.subscribed.load(Ordering::Relaxed)
        && let Err(err) = peer
            .notify_resource_updated(ResourceUpdatedNotificationParam::new(INBOX_RESOURCE))
            .await
    {
        tracing::debug!(error = %err, "announcing new messages failed");
        return false;
    }
    let note = LoggingMessageNotificationParam::new(
        LoggingLevel::Notice,
        serde_json::json!({
            "event": "inbox",
            "waiting": waiting,
            "goal_id": goal.id(),
            "message": format!("{waiting} unread peer message(s); call check_inbox to read them"),
        }),
    )
    .with_logger("switchboard");
    if let Err(err) = peer.notify_logging_message(note).await {
        tracing::debug!(error = %err, "announcing new messages failed");
        return false;
    }
    true
}
