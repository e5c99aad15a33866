//! The query index: an embedded SQLite database holding every record of `AGENT_AUDIT` by
//! sequence, with the ids threads and histories are looked up by. It is derived data: it can
//! be deleted at any time and is rebuilt by reading the stream again; rows below the stream's
//! first sequence (aged out) are dropped.
//!
//! Calls are synchronous and short; the service runs them on blocking threads. The appender's
//! duplicate check, [`Index::has`], runs on its own task and answers a source seen for the
//! first time from memory: a lookup would wait for the connection while the indexer holds it
//! for a whole batch, which serialised the writer behind the indexer (ingest 36k → 42–44k
//! messages/s in the audit bench without that wait).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};
use switchboard_proto::audit::{AuditEntry, HistoryRequest};
use uuid::Uuid;

/// Most records a thread gathers.
const THREAD_MAX: usize = 10_000;
/// Most expansion rounds of a thread (each follows one more hop of links).
const THREAD_ROUNDS: usize = 64;

/// The index failed.
#[derive(Debug, thiserror::Error)]
#[error("audit index: {0}")]
pub struct IndexError(String);

impl From<rusqlite::Error> for IndexError {
    fn from(err: rusqlite::Error) -> Self {
        Self(err.to_string())
    }
}

impl From<serde_json::Error> for IndexError {
    fn from(err: serde_json::Error) -> Self {
        Self(err.to_string())
    }
}

/// The index.
#[derive(Debug)]
pub struct Index {
    db: Mutex<Connection>,
    /// Per source stream, a sequence no record id of that stream in the index is above (the
    /// highest one inserted; pruning leaves it): an id `STREAM:n` above it has no record, which
    /// [`Index::has`] knows without the connection. Raised before the rows are inserted, so it
    /// is never below a row a reader can see.
    highest: Mutex<HashMap<String, u64>>,
}

/// The source stream and sequence of a record id (`AGENT_INBOX:42`), when it has that shape.
fn source_of(id: &str) -> Option<(&str, u64)> {
    let (stream, seq) = id.split_once(':')?;
    Some((stream, seq.parse().ok()?))
}

/// The entry as the index stores it (`AuditEntry` as JSON: `seq`, `hash`, then the record's
/// fields), made from the record's body as published, which is the record's own JSON: the
/// same text `serde_json` writes for the entry, without encoding the record a second time.
fn entry_json(entry: &AuditEntry, body: &[u8]) -> Result<String, IndexError> {
    match std::str::from_utf8(body) {
        Ok(text) if text.starts_with("{\"") => Ok(format!(
            "{{\"seq\":{},\"hash\":\"{}\",{}",
            entry.seq,
            entry.hash,
            &text[1..]
        )),
        _ => Ok(serde_json::to_string(entry)?),
    }
}

fn nanos(at: time::OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos()).unwrap_or(i64::MAX)
}

fn opt(id: Option<Uuid>) -> Option<String> {
    id.map(|id| id.to_string())
}

impl Index {
    /// Opens (or creates) the index at `path`. An empty path makes a private temporary file
    /// (SQLite's own, deleted when the index closes): the index is rebuilt at every start as
    /// if it were in memory, but only its page cache is (an in-memory index held ~8 KiB per
    /// record, 660 MiB at 83,000 records in `make bench`).
    pub fn open(path: &str) -> Result<Self, IndexError> {
        let db = if path.is_empty() {
            Connection::open("")?
        } else {
            if let Some(dir) = std::path::Path::new(path).parent()
                && !dir.as_os_str().is_empty()
            {
                std::fs::create_dir_all(dir).map_err(|err| IndexError(err.to_string()))?;
            }
            Connection::open(path)?
        };
        db.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             PRAGMA cache_size = -8192;
             CREATE TABLE IF NOT EXISTS records (
                 seq INTEGER PRIMARY KEY,
                 id TEXT NOT NULL UNIQUE,
                 at INTEGER NOT NULL,
                 kind TEXT NOT NULL,
                 message_id TEXT, correlation_id TEXT, in_reply_to TEXT,
                 task_id TEXT, parent_task_id TEXT,
                 from_agent TEXT, from_goal TEXT, to_agent TEXT, to_goal TEXT,
                 expects_reply INTEGER NOT NULL,
                 hash TEXT NOT NULL,
                 entry TEXT NOT NULL
             );
             -- Partial indexes on the ids most records lack (a plain message has no
             -- correlation, reply or task): fewer B-trees to update per insert, and every
             -- query on them (`x = ?`, `x IN (...)`) implies `x IS NOT NULL`, so SQLite still
             -- uses them. An index file made before keeps its full indexes (same names).
             CREATE INDEX IF NOT EXISTS by_message ON records(message_id) WHERE message_id IS NOT NULL;
             CREATE INDEX IF NOT EXISTS by_reply ON records(in_reply_to) WHERE in_reply_to IS NOT NULL;
             CREATE INDEX IF NOT EXISTS by_correlation ON records(correlation_id) WHERE correlation_id IS NOT NULL;
             CREATE INDEX IF NOT EXISTS by_task ON records(task_id) WHERE task_id IS NOT NULL;
             CREATE INDEX IF NOT EXISTS by_parent ON records(parent_task_id) WHERE parent_task_id IS NOT NULL;
             CREATE INDEX IF NOT EXISTS by_from ON records(from_agent);
             CREATE INDEX IF NOT EXISTS by_to ON records(to_agent);
             CREATE INDEX IF NOT EXISTS by_at ON records(at);",
        )?;
        // The highest sequence per source stream of an index that is not empty (a named file
        // opened again): one aggregate in SQLite.
        let mut highest = HashMap::new();
        {
            let mut tops = db.prepare(
                "SELECT substr(id, 1, instr(id, ':') - 1),
                        max(CAST(substr(id, instr(id, ':') + 1) AS INTEGER))
                 FROM records WHERE instr(id, ':') > 0 GROUP BY 1",
            )?;
            let mut rows = tops.query([])?;
            while let Some(row) = rows.next()? {
                let (stream, top): (String, i64) = (row.get(0)?, row.get(1)?);
                highest.insert(stream, u64::try_from(top).unwrap_or(0));
            }
        }
        Ok(Self {
            db: Mutex::new(db),
            highest: Mutex::new(highest),
        })
    }

    fn highest(&self) -> Result<std::sync::MutexGuard<'_, HashMap<String, u64>>, IndexError> {
        self.highest
            .lock()
            .map_err(|_| IndexError("the index lock is poisoned".to_owned()))
    }

    fn db(&self) -> Result<std::sync::MutexGuard<'_, Connection>, IndexError> {
        self.db
            .lock()
            .map_err(|_| IndexError("the index lock is poisoned".to_owned()))
    }

    /// The last record indexed: its sequence and hash.
    pub fn head(&self) -> Result<Option<(u64, String)>, IndexError> {
        Ok(self
            .db()?
            .query_row(
                "SELECT seq, hash FROM records ORDER BY seq DESC LIMIT 1",
                [],
                |row| Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?)),
            )
            .optional()?
            .map(|(seq, hash)| (u64::try_from(seq).unwrap_or(0), hash)))
    }

    /// Whether an event id has a record. An id past the highest source sequence indexed (a
    /// source seen for the first time) is answered from memory; others (redeliveries, a new
    /// consumer reading old sources) are looked up.
    pub fn has(&self, id: &str) -> Result<bool, IndexError> {
        if let Some((stream, seq)) = source_of(id)
            && self.highest()?.get(stream).is_none_or(|top| seq > *top)
        {
            return Ok(false);
        }
        Ok(self
            .db()?
            .prepare_cached("SELECT 1 FROM records WHERE id = ?1")?
            .query_row([id], |_| Ok(()))
            .optional()?
            .is_some())
    }

    /// Adds records (already in the stream); ones indexed before are skipped.
    pub fn insert(&self, entries: &[AuditEntry]) -> Result<(), IndexError> {
        self.insert_rows(entries.iter().map(|entry| (entry, None)))
    }

    /// Adds records this replica published, each with its body as published (the record's
    /// JSON, which the stored entry is made from); ones indexed before are skipped.
    pub fn insert_published<'a, I>(&self, rows: I) -> Result<(), IndexError>
    where
        I: IntoIterator<Item = (&'a AuditEntry, &'a [u8])>,
        I::IntoIter: Clone,
    {
        self.insert_rows(rows.into_iter().map(|(entry, body)| (entry, Some(body))))
    }

    fn insert_rows<'a>(
        &self,
        rows: impl Iterator<Item = (&'a AuditEntry, Option<&'a [u8]>)> + Clone,
    ) -> Result<(), IndexError> {
        {
            let mut highest = self.highest()?;
            for (entry, _) in rows.clone() {
                if let Some((stream, seq)) = source_of(&entry.record.id) {
                    match highest.get_mut(stream) {
                        Some(top) => *top = (*top).max(seq),
                        None => {
                            highest.insert(stream.to_owned(), seq);
                        }
                    }
                }
            }
        }
        let mut db = self.db()?;
        let tx = db.transaction()?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT OR IGNORE INTO records (seq, id, at, kind, message_id, correlation_id,
                   in_reply_to, task_id, parent_task_id, from_agent, from_goal, to_agent, to_goal,
                   expects_reply, hash, entry)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            )?;
            for (entry, body) in rows {
                let r = &entry.record;
                let json = match body {
                    Some(body) => entry_json(entry, body)?,
                    None => serde_json::to_string(entry)?,
                };
                insert.execute(params![
                    i64::try_from(entry.seq).unwrap_or(i64::MAX),
                    r.id,
                    nanos(r.at),
                    r.kind,
                    opt(r.message_id),
                    opt(r.correlation_id),
                    opt(r.in_reply_to),
                    opt(r.task_id),
                    opt(r.parent_task_id),
                    r.from_agent,
                    r.from_goal.map(|g| g.to_string()),
                    r.to_agent,
                    r.to_goal.map(|g| g.to_string()),
                    r.expects_reply,
                    entry.hash,
                    json,
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Drops rows the stream no longer holds.
    pub fn prune_below(&self, first_seq: u64) -> Result<usize, IndexError> {
        Ok(self.db()?.execute(
            "DELETE FROM records WHERE seq < ?1",
            [i64::try_from(first_seq).unwrap_or(i64::MAX)],
        )?)
    }

    fn entries(
        db: &Connection,
        sql: &str,
        params: &[&dyn rusqlite::ToSql],
    ) -> Result<Vec<AuditEntry>, IndexError> {
        let mut statement = db.prepare(sql)?;
        let rows = statement.query_map(params, |row| row.get::<_, String>(0))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(serde_json::from_str(&row?)?);
        }
        Ok(out)
    }

    /// The conversation around the given ids: follows `in_reply_to` both ways, correlation
    /// ids (a call's request, events and answer), and tasks with their parents and children,
    /// until nothing new is linked. Oldest first (by stored time, then sequence).
    pub fn thread(
        &self,
        message: Option<Uuid>,
        correlation: Option<Uuid>,
        task: Option<Uuid>,
    ) -> Result<Vec<AuditEntry>, IndexError> {
        let db = self.db()?;
        let mut messages: BTreeSet<String> = message.iter().map(Uuid::to_string).collect();
        let mut calls: BTreeSet<String> = correlation.iter().map(Uuid::to_string).collect();
        let mut tasks: BTreeSet<String> = task.iter().map(Uuid::to_string).collect();
        let mut found: std::collections::BTreeMap<u64, AuditEntry> = Default::default();
        for _ in 0..THREAD_ROUNDS {
            let list = |set: &BTreeSet<String>| {
                // Every element is a formatted UUID, so quoting cannot be escaped.
                set.iter()
                    .map(|id| format!("'{id}'"))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let sql = format!(
                "SELECT entry FROM records WHERE message_id IN ({m}) OR in_reply_to IN ({m})
                   OR correlation_id IN ({c}) OR task_id IN ({t}) OR parent_task_id IN ({t})",
                m = list(&messages),
                c = list(&calls),
                t = list(&tasks)
            );
            let before = (messages.len(), calls.len(), tasks.len(), found.len());
            for entry in Self::entries(&db, &sql, &[])? {
                let r = &entry.record;
                messages.extend(
                    r.message_id
                        .iter()
                        .chain(&r.in_reply_to)
                        .map(Uuid::to_string),
                );
                calls.extend(r.correlation_id.iter().map(Uuid::to_string));
                tasks.extend(
                    r.task_id
                        .iter()
                        .chain(&r.parent_task_id)
                        .map(Uuid::to_string),
                );
                found.insert(entry.seq, entry);
                if found.len() >= THREAD_MAX {
                    break;
                }
            }
            if (messages.len(), calls.len(), tasks.len(), found.len()) == before
                || found.len() >= THREAD_MAX
            {
                break;
            }
        }
        let mut out: Vec<AuditEntry> = found.into_values().collect();
        out.sort_by_key(|e| (e.record.at, e.seq));
        Ok(out)
    }

    /// Records matching a filter, by sequence, after `cursor`, at most `limit`.
    pub fn history(
        &self,
        filter: &HistoryRequest,
        cursor: u64,
        limit: usize,
    ) -> Result<Vec<AuditEntry>, IndexError> {
        let db = self.db()?;
        let mut sql = String::from("SELECT entry FROM records WHERE seq > ?1");
        let mut values: Vec<Box<dyn rusqlite::ToSql>> =
            vec![Box::new(i64::try_from(cursor).unwrap_or(i64::MAX))];
        let mut bind = |clause: &str, value: Box<dyn rusqlite::ToSql>, values: &mut Vec<_>| {
            values.push(value);
            sql.push_str(&clause.replace('?', &format!("?{}", values.len())));
        };
        if let Some(agent) = &filter.agent_id {
            bind(
                " AND (from_agent = ? ",
                Box::new(agent.clone()),
                &mut values,
            );
            bind("OR to_agent = ?)", Box::new(agent.clone()), &mut values);
        }
        if let Some(goal) = &filter.goal_id {
            bind(
                " AND (from_goal = ? ",
                Box::new(goal.to_string()),
                &mut values,
            );
            bind("OR to_goal = ?)", Box::new(goal.to_string()), &mut values);
        }
        if let Some(task) = &filter.task_id {
            bind(" AND task_id = ?", Box::new(task.to_string()), &mut values);
        }
        if let Some(since) = filter.since {
            bind(" AND at >= ?", Box::new(nanos(since)), &mut values);
        }
        if let Some(until) = filter.until {
            bind(" AND at < ?", Box::new(nanos(until)), &mut values);
        }
        if let Some(kind) = &filter.kind {
            match kind.strip_suffix(".*") {
                Some(family) => bind(
                    " AND kind LIKE ? ESCAPE '\\'",
                    Box::new(format!(
                        "{}.%",
                        family
                            .replace('\\', "\\\\")
                            .replace('%', "\\%")
                            .replace('_', "\\_")
                    )),
                    &mut values,
                ),
                None => bind(" AND kind = ?", Box::new(kind.clone()), &mut values),
            }
        }
        bind(
            " ORDER BY seq LIMIT ?",
            Box::new(i64::try_from(limit).unwrap_or(i64::MAX)),
            &mut values,
        );
        let params: Vec<&dyn rusqlite::ToSql> = values.iter().map(|v| v.as_ref()).collect();
        Self::entries(&db, &sql, &params)
    }

    /// The budget records of one tree (its root id is their correlation id), by sequence.
    pub fn budget_tree(&self, root: &str) -> Result<Vec<AuditEntry>, IndexError> {
        let db = self.db()?;
        Self::entries(
            &db,
            "SELECT entry FROM records WHERE correlation_id = ?1 AND kind LIKE 'budget.%'
             ORDER BY seq",
            &[&root],
        )
    }

    /// The `budget.spent` records of one agent, newest first, at most `limit`.
    pub fn budget_spent_by(
        &self,
        agent: &str,
        limit: usize,
    ) -> Result<Vec<AuditEntry>, IndexError> {
        let db = self.db()?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Self::entries(
            &db,
            "SELECT entry FROM records WHERE from_agent = ?1 AND kind = 'budget.spent'
             ORDER BY seq DESC LIMIT ?2",
            &[&agent, &limit],
        )
    }

    /// Requests that expect a reply and have none: no response, answer, expiry or later
    /// message in reply to them. One entry per request (its first delivery).
    pub fn pending(&self) -> Result<Vec<AuditEntry>, IndexError> {
        let db = self.db()?;
        Self::entries(
            &db,
            "SELECT r.entry FROM records r
             WHERE r.expects_reply = 1
               AND r.seq = (SELECT MIN(seq) FROM records d WHERE d.message_id = r.message_id)
               AND NOT EXISTS (
                 SELECT 1 FROM records a
                 WHERE (r.correlation_id IS NOT NULL AND a.correlation_id = r.correlation_id
                        AND a.kind IN ('response', 'call.answered', 'call.expired'))
                    OR (a.in_reply_to = r.message_id AND a.seq > r.seq))
             ORDER BY r.seq",
            &[],
        )
    }

    /// How many records the index holds.
    pub fn count(&self) -> Result<u64, IndexError> {
        let n: i64 = self
            .db()?
            .query_row("SELECT COUNT(*) FROM records", [], |row| row.get(0))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use switchboard_proto::audit::{AuditEntry, HistoryRequest};

    use super::{Index, entry_json};
    use crate::record;

    fn entries() -> Vec<AuditEntry> {
        let goal = "0193a1b2-0000-7000-8000-000000000001";
        let message = serde_json::json!({
            "id": "0193a1b2-0000-7000-8000-0000000000aa",
            "from_agent_id": "writer", "to_agent_id": "reader",
            "from_goal_id": "0193a1b2-0000-7000-8000-0000000000bb",
            "correlation_id": "0193a1b2-0000-7000-8000-0000000000cc",
            "kind": "request", "expects_reply": true,
            "body": "quotes \" and \\\\ and ünïcode", "metadata": {"x": 1.5},
        });
        let sources = [
            (
                "AGENT_INBOX",
                format!("agent.inbox.{goal}"),
                message.to_string(),
            ),
            (
                "AGENT_EVENTS",
                "agent.calls.events.opened.x".to_owned(),
                "{}".to_owned(),
            ),
            (
                "AGENT_EVENTS",
                "agent.refusals.x.y".to_owned(),
                "not json".to_owned(),
            ),
        ];
        sources
            .iter()
            .enumerate()
            .map(|(n, (stream, subject, payload))| {
                let mut record = record::from_source(
                    stream,
                    n as u64 + 7,
                    time::OffsetDateTime::now_utc(),
                    subject,
                    payload.as_bytes(),
                );
                record.prev_hash = "genesis".to_owned();
                let body = serde_json::to_vec(&record).unwrap();
                AuditEntry {
                    seq: n as u64 + 1,
                    hash: record::hash(&body),
                    record,
                }
            })
            .collect()
    }

    /// The entry the writer stores, made from the published body, is what serde writes for
    /// the entry: queries read the same JSON whichever way a row came in.
    #[test]
    fn the_entry_made_from_the_body_is_the_serialized_entry() {
        for entry in entries() {
            let body = serde_json::to_vec(&entry.record).unwrap();
            assert_eq!(
                entry_json(&entry, &body).unwrap(),
                serde_json::to_string(&entry).unwrap()
            );
        }
    }

    #[test]
    fn published_and_read_rows_answer_alike() {
        let entries = entries();
        let bodies: Vec<Vec<u8>> = entries
            .iter()
            .map(|e| serde_json::to_vec(&e.record).unwrap())
            .collect();
        let (published, read) = (Index::open("").unwrap(), Index::open("").unwrap());
        published
            .insert_published(entries.iter().zip(bodies.iter().map(Vec::as_slice)))
            .unwrap();
        read.insert(&entries).unwrap();
        let all = |index: &Index| index.history(&HistoryRequest::default(), 0, 100).unwrap();
        assert_eq!(all(&published), entries);
        assert_eq!(all(&read), entries);
        assert!(published.has("AGENT_INBOX:7").unwrap());
        assert!(!published.has("AGENT_INBOX:8").unwrap());
    }

    /// A source seen for the first time is answered from memory; one at or below the highest
    /// sequence indexed is looked up; and a named index opened again finds its bound in its
    /// rows (without it, a recorded source would read as new and be recorded twice).
    #[test]
    fn has_answers_new_sources_from_memory_and_the_rest_from_the_rows_also_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.sqlite");
        let path = path.to_str().unwrap();
        let entries = entries();
        {
            let index = Index::open(path).unwrap();
            assert!(!index.has("AGENT_INBOX:7").unwrap());
            index.insert(&entries[1..]).unwrap();
            assert!(index.has("AGENT_EVENTS:8").unwrap());
            assert!(index.has("AGENT_EVENTS:9").unwrap());
            assert!(!index.has("AGENT_EVENTS:10").unwrap());
            assert!(
                !index.has("AGENT_EVENTS:1").unwrap(),
                "below the bound, never indexed"
            );
            assert!(!index.has("AGENT_INBOX:7").unwrap());
        }
        let index = Index::open(path).unwrap();
        assert_eq!(index.highest().unwrap().get("AGENT_EVENTS"), Some(&9));
        assert!(!index.highest().unwrap().contains_key("AGENT_INBOX"));
        assert!(index.has("AGENT_EVENTS:9").unwrap());
        assert!(!index.has("AGENT_EVENTS:10").unwrap());
    }
}
