//! Delivery into agents' goal inboxes: what the fan-out, the correlator and the task service
//! all do when they put a message where an agent reads it, so they agree on it.
//!
//! - [`door`]: the one door into every inbox — [`door::Door::deliver`] takes an agent's
//!   message or a service's word, applies the rules its [`door::Origin`] calls for and keys
//!   every copy the same way;
//! - [`deliver`]: a durable publish into a goal that makes room when the goal is full, and
//!   the `kind: receipt` messages owed to senders;
//! - [`room`]: how room is made (purge read messages, evict the oldest unread with a notice to
//!   its sender, or refuse under `overflow: refuse`);
//! - [`error`]: why a delivery failed, and its stable kind;
//! - [`files`]: attachments at the door: who may pass a file on, and the grants of its
//!   readers;
//! - [`holders`]: who holds a full goal, remembered for a moment so a goal nobody reads is
//!   not read again for every send into it;
//! - [`receipts`]: the receipt records in KV `agent_receipts`;
//! - [`registry_view`]: a service's local view of the registry, which resolves who a message
//!   goes to (the directory and the gateway read agents and goals through it too).
//!
//! The dependency points inward: this crate builds on `switchboard-runtime`'s generic durable
//! publish and KV reads; the runtime knows nothing of goals.

pub mod deliver;
pub mod door;
pub mod error;
pub mod files;
pub mod holders;
pub mod receipts;
pub mod registry_view;
pub mod room;
