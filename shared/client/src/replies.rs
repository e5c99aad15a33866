//! Answering calls: a reply, a reply with parts, a part of a streamed answer, the end of a
//! stream, and a failure (`error`), all through `agent.reply.<agent_id>` (docs/protocol.md
//! §9, "Answering").

use switchboard_proto::call::{ReplyAck, ReplyRequest};
use switchboard_proto::subject;
use switchboard_request::request::request_json_retrying;
use uuid::Uuid;

use crate::agent::Agent;
use crate::error::ClientError;

impl Agent {
    /// reply_to_peer: answers the call `correlation_id` (no target needed).
    ///
    /// Retried and hedged like a send: the correlator delivers an answer once however many
    /// copies reach it (a later copy gets `duplicate: true`), so a correlator replica that goes
    /// away mid-request costs a fraction of a second, not the request timeout.
    pub async fn reply(
        &self,
        correlation_id: Uuid,
        message: &str,
    ) -> Result<ReplyAck, ClientError> {
        self.send_reply(&ReplyRequest {
            correlation_id: Some(correlation_id),
            message: Some(message.to_owned()),
            ..ReplyRequest::default()
        })
        .await
    }

    /// reply_to_peer with structured content: answers the call `correlation_id` with
    /// `message` and `parts` (data, files), carried to the caller as they are.
    pub async fn reply_with_parts(
        &self,
        correlation_id: Uuid,
        message: &str,
        parts: Vec<switchboard_proto::Part>,
    ) -> Result<ReplyAck, ClientError> {
        self.send_reply(&ReplyRequest {
            correlation_id: Some(correlation_id),
            message: Some(message.to_owned()),
            parts,
            ..ReplyRequest::default()
        })
        .await
    }

    /// reply_to_peer with files (docs/protocol.md §17): answers the call `correlation_id` with
    /// `message` and `attachments` (each uploaded by this agent, or delivered to it); the
    /// caller may read them once the answer reaches it.
    pub async fn reply_with_attachments(
        &self,
        correlation_id: Uuid,
        message: &str,
        attachments: Vec<switchboard_proto::files::Attachment>,
    ) -> Result<ReplyAck, ClientError> {
        self.send_reply(&ReplyRequest {
            correlation_id: Some(correlation_id),
            message: Some(message.to_owned()),
            attachments,
            ..ReplyRequest::default()
        })
        .await
    }

    /// Any reply with every option (whole or partial, `parts`, `attachments`, `part`),
    /// retried and hedged like the others: it is taken once however many copies arrive.
    pub async fn reply_with(&self, request: ReplyRequest) -> Result<ReplyAck, ClientError> {
        self.send_reply(&request).await
    }

    /// Answers the call `correlation_id` with a failure: the caller's answer carries
    /// `error: {kind, message}` (kind 1–64 of `[a-z0-9_]`, e.g. `handler_error`) instead of a
    /// result, at once rather than at its deadline.
    pub async fn reply_error(
        &self,
        correlation_id: Uuid,
        kind: &str,
        message: &str,
    ) -> Result<ReplyAck, ClientError> {
        self.send_reply(&ReplyRequest {
            correlation_id: Some(correlation_id),
            error: Some(switchboard_proto::call::ReplyError {
                kind: kind.to_owned(),
                message: message
                    .chars()
                    .take(switchboard_proto::call::REPLY_ERROR_MESSAGE_MAX)
                    .collect(),
            }),
            ..ReplyRequest::default()
        })
        .await
    }

    /// Ends the streamed answer to `correlation_id` with nothing more to say: a final reply
    /// without text after its parts (the answer is the parts' text).
    pub async fn end_stream(&self, correlation_id: Uuid) -> Result<ReplyAck, ClientError> {
        self.send_reply(&ReplyRequest {
            correlation_id: Some(correlation_id),
            ..ReplyRequest::default()
        })
        .await
    }

    async fn send_reply(&self, body: &ReplyRequest) -> Result<ReplyAck, ClientError> {
        request_json_retrying(
            self.nats(),
            &subject::reply(self.id()),
            body,
            self.options().request_timeout,
            self.options().send_retries,
        )
        .await
        .map_err(ClientError::from)
    }

    /// A partial reply to the call `correlation_id`: part `part` (1, 2, 3…) of a streamed
    /// answer. The call stays open until [`Agent::reply`] sends the final part. Retried like a
    /// reply: the number makes a repeat a duplicate, never a second part.
    pub async fn reply_part(
        &self,
        correlation_id: Uuid,
        part: u32,
        message: &str,
    ) -> Result<ReplyAck, ClientError> {
        self.send_reply(&ReplyRequest {
            correlation_id: Some(correlation_id),
            message: Some(message.to_owned()),
            partial: true,
            part: Some(part),
            ..ReplyRequest::default()
        })
        .await
    }
}
