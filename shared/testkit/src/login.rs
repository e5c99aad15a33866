//! [`Login`]: how a test client signs in to a test server (open, a password, an NKey).

/// How a client signs in to a test server.
#[derive(Debug, Clone)]
pub enum Login {
    /// No credentials.
    Open,
    /// A user and password.
    Password(String, String),
    /// An NKey seed (`SU…`).
    Nkey(String),
}

impl Login {
    /// Connect options carrying these credentials.
    pub fn options(&self) -> async_nats::ConnectOptions {
        match self {
            Login::Open => async_nats::ConnectOptions::new(),
            Login::Password(user, password) => {
                async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
            }
            Login::Nkey(seed) => async_nats::ConnectOptions::with_nkey(seed.clone()),
        }
    }
}
