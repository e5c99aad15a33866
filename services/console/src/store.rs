//! Sign-in and sessions. A session lives in this replica's memory, keyed by the SHA-256 of its
//! cookie value (the value itself is kept nowhere), with its own CSRF token. Every request
//! reads the person again from the people file, so a person removed from it, or whose access
//! changed, is refused at once.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};
use switchboard_runtime::people_book::{Access, Books, Person};

/// Most sessions held at once; the oldest is dropped past it.
const MAX_SESSIONS: usize = 10_000;

/// Lowercase hex SHA-256.
pub fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// A fresh 256-bit random value, hex.
pub fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    if SystemRandom::new().fill(&mut bytes).is_err() {
        // The system's random source failing is not something to serve on.
        std::process::abort();
    }
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Equal without an early exit (no timing oracle on secrets).
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// One signed-in person.
#[derive(Debug, Clone)]
pub struct Session {
    /// The person (`alice`).
    pub person: String,
    /// The CSRF token every state-changing request must carry.
    pub csrf: String,
    expires: Instant,
}

/// Who a request is from, checked against today's people file.
#[derive(Debug, Clone)]
pub struct Signed {
    /// The session.
    pub session: Session,
    /// The person as the file says now.
    pub person: Person,
}

impl Signed {
    /// Whether the person holds `access`.
    pub fn may(&self, access: Access) -> bool {
        self.person.access.contains(&access)
    }
}

/// The sessions, the people file and the one-time token.
#[derive(Debug)]
pub struct Sessions {
    by_hash: Mutex<HashMap<String, Session>>,
    books: Books,
    ttl: Duration,
    bootstrap: Mutex<Option<(String, String)>>,
}

impl Sessions {
    /// Sessions checked against `books`; `bootstrap` is `(token_sha256, person)`.
    pub fn new(books: Books, ttl: Duration, bootstrap: Option<(String, String)>) -> Self {
        Self {
            by_hash: Mutex::default(),
            books,
            ttl,
            bootstrap: Mutex::new(bootstrap),
        }
    }

    /// Signs in with a token: the one-time token (once), or one whose hash a person lists.
    /// Returns the cookie value and the session.
    pub fn sign_in(&self, token: &str) -> Option<(String, Signed)> {
        if token.is_empty() || token.len() > 256 {
            return None;
        }
        let hash = sha256_hex(token);
        let book = self.books.now();
        let by_bootstrap = {
            let mut bootstrap = self
                .bootstrap
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match bootstrap.as_ref() {
                // Used up only when it signs someone in.
                Some((want, person))
                    if same(want, &hash) && book.person_named(person).is_some() =>
                {
                    let person = person.clone();
                    *bootstrap = None;
                    Some(person)
                }
                _ => None,
            }
        };
        let person = match by_bootstrap {
            Some(name) => book.person_named(&name)?.clone(),
            None => {
                let wanted = format!("sha256:{hash}");
                let mut found = None;
                // Every hash is compared, matched or not.
                for candidate in book.persons() {
                    for listed in &candidate.token_hashes {
                        if same(&listed.to_ascii_lowercase(), &wanted) {
                            found = Some(candidate.clone());
                        }
                    }
                }
                found?
            }
        };
        let cookie = random_hex();
        let session = Session {
            person: person.id.to_string(),
            csrf: random_hex(),
            expires: Instant::now() + self.ttl,
        };
        let mut sessions = self.by_hash.lock().unwrap_or_else(PoisonError::into_inner);
        if sessions.len() >= MAX_SESSIONS {
            let now = Instant::now();
            sessions.retain(|_, s| s.expires > now);
            if sessions.len() >= MAX_SESSIONS
                && let Some(oldest) = sessions
                    .iter()
                    .min_by_key(|(_, s)| s.expires)
                    .map(|(k, _)| k.clone())
            {
                sessions.remove(&oldest);
            }
        }
        sessions.insert(sha256_hex(&cookie), session.clone());
        tracing::info!(person = %person.id, "signed in to the console");
        Some((cookie, Signed { session, person }))
    }

    /// The session a cookie value names, with its person as the file says now.
    pub fn check(&self, cookie: &str) -> Option<Signed> {
        let key = sha256_hex(cookie);
        let session = {
            let mut sessions = self.by_hash.lock().unwrap_or_else(PoisonError::into_inner);
            match sessions.get(&key) {
                Some(session) if session.expires > Instant::now() => session.clone(),
                Some(_) => {
                    sessions.remove(&key);
                    return None;
                }
                None => return None,
            }
        };
        let person = self.books.now().person_named(&session.person)?.clone();
        Some(Signed { session, person })
    }

    /// Ends a session.
    pub fn sign_out(&self, cookie: &str) {
        self.by_hash
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&sha256_hex(cookie));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_runtime::people_book::Book;

    #[test]
    fn tokens_sign_in_and_the_one_time_token_works_once() {
        let token = "s3cret-token";
        let file = format!(
            "[[person]]\nid = \"alice\"\naccess = [\"viewer\"]\ntokens = [\"sha256:{}\"]\n[[person]]\nid = \"admin\"\naccess = [\"operator\"]\n",
            sha256_hex(token)
        );
        let books = Books::fixed(Book::parse(&file).unwrap());
        let once = random_hex();
        let sessions = Sessions::new(
            books,
            Duration::from_secs(60),
            Some((sha256_hex(&once), "admin".to_owned())),
        );
        let (cookie, signed) = sessions.sign_in(token).unwrap();
        assert_eq!(signed.person.id.as_str(), "alice");
        assert!(signed.may(Access::Viewer) && !signed.may(Access::Operator));
        assert_eq!(sessions.check(&cookie).unwrap().session.person, "alice");
        assert!(sessions.sign_in("wrong").is_none());
        let (_, admin) = sessions.sign_in(&once).unwrap();
        assert_eq!(admin.person.id.as_str(), "admin");
        assert!(
            sessions.sign_in(&once).is_none(),
            "the one-time token works once"
        );
        sessions.sign_out(&cookie);
        assert!(sessions.check(&cookie).is_none());
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }
}
