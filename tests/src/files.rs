//! What the files tests share (docs/protocol.md §17): a fabric with a files replica, bytes
//! that differ chunk by chunk, digests in hex, the attachments of the next message.

use std::time::Duration;

use switchboard_client::ClientError;
use switchboard_proto::ErrorKind;
use switchboard_proto::files::Attachment;

use crate::Fabric;
use crate::services::{Replica, start_files_with};

/// The error reply's kind of a failed request.
pub fn kind(err: &ClientError) -> ErrorKind {
    err.kind()
        .unwrap_or_else(|| panic!("an error reply, got {err}"))
}

/// A digest (or any bytes) in lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// `len` bytes that differ chunk by chunk (a chunk served for another would not hash right).
pub fn data(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(2_654_435_761).rotate_right(13) as u8)
        .collect()
}

/// A fabric (nats-server and the four request services) with a files replica of `config`.
pub async fn fabric_with_files(config: files::FilesConfig) -> (Fabric, Replica) {
    let fabric = Fabric::start().await;
    let files = start_files_with(&fabric.url(), config).await;
    (fabric, files)
}

/// The next message of `goal`, acknowledged: its attachments.
pub async fn attachments_of(goal: &switchboard_client::Goal) -> Vec<Attachment> {
    let delivery = goal
        .recv(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("a message within 10 s");
    delivery.ack().await.unwrap().attachments
}

/// The `error.kind` of a raw JSON reply (`"none"` for a reply that is not an error).
pub fn error_kind(reply: &serde_json::Value) -> &str {
    reply["error"]["kind"].as_str().unwrap_or("none")
}
