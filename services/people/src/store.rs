//! Items in the `agent_people_items` bucket, key `item.<item_id>` (docs/protocol.md §14):
//! every state change is a compare-and-set on the record's revision, so an answer, a second
//! answer, an escalation and an expiry race and exactly one wins, across replicas and restarts.

use async_nats::jetstream::kv;
use bytes::Bytes;
use switchboard_proto::people::PersonItem;
use switchboard_runtime::store::StoreError;
use uuid::Uuid;

/// The key of an item.
pub fn item_key(id: &Uuid) -> String {
    format!("item.{id}")
}

/// An item as read or written, with its revision.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The record.
    pub item: PersonItem,
    /// Its KV revision; a write naming an older one is refused.
    pub revision: u64,
}

/// The items bucket.
#[derive(Debug, Clone)]
pub struct ItemStore {
    items: kv::Store,
}

fn encode(item: &PersonItem) -> Result<Bytes, StoreError> {
    serde_json::to_vec(item)
        .map(Bytes::from)
        .map_err(|err| StoreError::Corrupt(err.to_string()))
}

impl ItemStore {
    /// Wraps the applied bucket.
    pub fn new(items: kv::Store) -> Self {
        Self { items }
    }

    /// The bucket (for the view's watch).
    pub fn bucket(&self) -> &kv::Store {
        &self.items
    }

    /// An item by id.
    pub async fn get(&self, id: &Uuid) -> Result<Option<Stored>, StoreError> {
        let key = item_key(id);
        let entry = self
            .items
            .entry(key.as_str())
            .await
            .map_err(|err| StoreError::store("reading the item", err))?;
        match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let item =
                    serde_json::from_slice(&entry.value).map_err(|_| StoreError::Corrupt(key))?;
                Ok(Some(Stored {
                    item,
                    revision: entry.revision,
                }))
            }
            _ => Ok(None),
        }
    }

    /// Records a new item; `Ok(None)` when its id is taken.
    pub async fn create(&self, item: &PersonItem) -> Result<Option<Stored>, StoreError> {
        match self
            .items
            .create(item_key(&item.item_id).as_str(), encode(item)?)
            .await
        {
            Ok(revision) => Ok(Some(Stored {
                item: item.clone(),
                revision,
            })),
            Err(err) if switchboard_request::kv::already_exists(&err) => Ok(None),
            Err(err) => Err(StoreError::store("recording the item", err)),
        }
    }

    /// Replaces `stored` with `next` if nobody changed it since it was read; `Ok(None)` when
    /// another writer won (re-read to see what happened).
    pub async fn replace(
        &self,
        stored: &Stored,
        next: PersonItem,
    ) -> Result<Option<Stored>, StoreError> {
        match self
            .items
            .update(
                item_key(&next.item_id).as_str(),
                encode(&next)?,
                stored.revision,
            )
            .await
        {
            Ok(revision) => Ok(Some(Stored {
                item: next,
                revision,
            })),
            Err(err) if switchboard_request::kv::lost_revision(&err) => Ok(None),
            Err(err) => Err(StoreError::store("updating the item", err)),
        }
    }
}
