use super::*;

fn spec(concurrent: Option<u32>, rpm: Option<u64>, tpm: Option<u64>) -> LimitSpec {
    LimitSpec {
        key: "openai:gpt-4.1".to_owned(),
        concurrent,
        requests_per_minute: rpm,
        tokens_per_minute: tpm,
        per_agent: None,
        max_hold_ms: None,
        burst_ms: None,
    }
}

fn agent(n: usize) -> AgentId {
    AgentId::parse(&format!("a{n}")).unwrap()
}

fn acquire(id: u128, who: usize, now: u64, wait: u64) -> Op {
    Op::Acquire {
        id: Uuid::from_u128(id),
        agent: agent(who),
        tokens: 0,
        hold_ms: 10_000,
        at_ms: now,
        deadline_ms: now + wait,
    }
}

#[test]
fn never_more_leases_than_the_limit_nor_than_an_agents_share() {
    let spec = spec(Some(4), None, None);
    let mut ledger = Ledger::default();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut ids = Vec::new();
    for step in 0..5_000u64 {
        let now = 1_000_000 + step * 7;
        let op = match next() % 3 {
            0 | 1 => {
                let id = u128::from(step) + 1;
                ids.push((id, (next() % 5) as usize));
                let (id, who) = *ids.last().unwrap();
                acquire(id, who, now, next() % 200)
            }
            _ if !ids.is_empty() => {
                let (id, who) = ids[(next() as usize) % ids.len()];
                Op::Release {
                    id: Uuid::from_u128(id),
                    agent: agent(who),
                    used: None,
                }
            }
            _ => continue,
        };
        ledger.apply(&spec, &[op], now);
        assert!(ledger.leases.len() <= 4, "{ledger:?}");
        for who in 0..5 {
            let held = ledger
                .leases
                .iter()
                .filter(|l| l.agent == agent(who))
                .count();
            assert!(held <= 2, "agent {who} holds {held}");
        }
    }
}

#[test]
fn waiting_acquires_go_to_the_agent_holding_fewest_then_the_oldest() {
    let spec = LimitSpec {
        per_agent: Some(3),
        ..spec(Some(3), None, None)
    };
    let mut ledger = Ledger::default();
    // a0 takes two leases, a1 one: full.
    for (id, who) in [(1, 0), (2, 0), (3, 1)] {
        let out = ledger.apply(&spec, &[acquire(id, who, 0, 0)], 0);
        assert!(matches!(out[0], Outcome::Granted(_)), "{out:?}");
    }
    // a0 waits first, then a2: a2 holds none, so it goes first when a lease returns.
    assert_eq!(
        ledger.apply(&spec, &[acquire(4, 0, 1, 1_000)], 1),
        [Outcome::Waiting]
    );
    assert_eq!(
        ledger.apply(&spec, &[acquire(5, 2, 2, 1_000)], 2),
        [Outcome::Waiting]
    );
    let release = Op::Release {
        id: Uuid::from_u128(3),
        agent: agent(1),
        used: None,
    };
    assert_eq!(
        ledger.apply(&spec, &[release], 3),
        [Outcome::Released(true)]
    );
    assert!(ledger.leases.iter().any(|l| l.id == Uuid::from_u128(5)));
    assert_eq!(ledger.queue.len(), 1);
    // A waiting acquire past its deadline is refused and leaves the queue.
    let withdraw = Op::Withdraw {
        id: Uuid::from_u128(4),
        agent: agent(0),
    };
    let out = ledger.apply(&spec, &[withdraw], 4);
    assert!(matches!(out[0], Outcome::Limited { .. }), "{out:?}");
    assert!(ledger.queue.is_empty());
}

#[test]
fn the_rate_paces_grants_and_a_release_corrects_the_tokens() {
    // 120 a minute: 2 a second, a burst of 2.
    let spec = spec(None, Some(120), Some(6_000));
    let mut ledger = Ledger::default();
    let mut granted = 0;
    for n in 0..10 {
        if matches!(
            ledger.apply(&spec, &[acquire(n + 1, n as usize, 0, 0)], 0)[0],
            Outcome::Granted(_)
        ) {
            granted += 1;
        }
    }
    assert_eq!(granted, 2);
    // Half a second later, one more.
    let out = ledger.apply(&spec, &[acquire(100, 0, 500, 0)], 500);
    assert!(matches!(out[0], Outcome::Granted(_)), "{out:?}");
    let out = ledger.apply(&spec, &[acquire(101, 1, 500, 0)], 500);
    assert!(matches!(out[0], Outcome::Limited { .. }), "{out:?}");

    // Tokens: 100 a second; 80 estimated, 10 used: 70 come back.
    let spec = spec_tokens();
    let mut ledger = Ledger::default();
    let big = Op::Acquire {
        id: Uuid::from_u128(1),
        agent: agent(0),
        tokens: 80,
        hold_ms: 1_000,
        at_ms: 0,
        deadline_ms: 0,
    };
    assert!(matches!(
        ledger.apply(&spec, &[big], 0)[0],
        Outcome::Granted(_)
    ));
    let level = ledger.tokens.unwrap().level;
    assert!((level - 20.0).abs() < 1e-6, "{level}");
    let release = Op::Release {
        id: Uuid::from_u128(1),
        agent: agent(0),
        used: Some(10),
    };
    ledger.apply(&spec, &[release], 0);
    let level = ledger.tokens.unwrap().level;
    assert!((level - 90.0).abs() < 1e-6, "{level}");
}

fn spec_tokens() -> LimitSpec {
    spec(None, None, Some(6_000))
}

#[test]
fn another_agents_lease_can_be_neither_released_renewed_nor_claimed() {
    let spec = spec(Some(2), None, None);
    let mut ledger = Ledger::default();
    ledger.apply(&spec, &[acquire(1, 0, 0, 0)], 0);
    let steal = Op::Release {
        id: Uuid::from_u128(1),
        agent: agent(1),
        used: Some(0),
    };
    assert_eq!(ledger.apply(&spec, &[steal], 1), [Outcome::Released(false)]);
    assert_eq!(ledger.leases.len(), 1);
    let renew = Op::Renew {
        id: Uuid::from_u128(1),
        agent: agent(1),
        hold_ms: 99_999,
    };
    assert_eq!(ledger.apply(&spec, &[renew], 1), [Outcome::Gone]);
    // The same lease id from another agent is not a retry.
    assert_eq!(
        ledger.apply(&spec, &[acquire(1, 1, 1, 0)], 1),
        [Outcome::Gone]
    );
    // A retried acquire by its owner gets the same lease.
    let again = ledger.apply(&spec, &[acquire(1, 0, 2, 0)], 2);
    assert!(matches!(&again[0], Outcome::Granted(l) if l.id == Uuid::from_u128(1)));
    // It returns by itself at its expiry.
    ledger.apply(&spec, &[], 10_001);
    assert!(ledger.leases.is_empty());
}

#[test]
fn the_queue_is_bounded_per_agent_and_in_all() {
    let spec = spec(Some(1), None, None);
    let mut ledger = Ledger::default();
    ledger.apply(&spec, &[acquire(1, 0, 0, 0)], 0);
    let mut refused = 0;
    for n in 0..(WAITING_PER_AGENT_MAX as u128 + 5) {
        if let Outcome::Limited { .. } =
            ledger.apply(&spec, &[acquire(100 + n, 1, 1, 60_000)], 1)[0]
        {
            refused += 1;
        }
    }
    assert_eq!(refused, 5);
    assert_eq!(ledger.queue.len(), WAITING_PER_AGENT_MAX);
}

#[test]
fn a_copy_of_a_waiting_acquire_never_ends_the_wait_it_copies() {
    let spec = spec(Some(1), None, None);
    let mut ledger = Ledger::default();
    ledger.apply(&spec, &[acquire(1, 0, 0, 0)], 0);
    assert_eq!(
        ledger.apply(&spec, &[acquire(2, 1, 10, 5_000)], 10),
        [Outcome::Waiting]
    );
    // The same acquire again, answered at once (its replica had no room to hold it).
    assert_eq!(
        ledger.apply(&spec, &[acquire(2, 1, 20, 0)], 20),
        [Outcome::Waiting]
    );
    assert_eq!(ledger.queue.len(), 1);
    assert_eq!(ledger.queue[0].deadline_ms, 5_010);
}

#[test]
fn a_batch_of_acquires_that_all_fit_never_trips_the_waiting_cap() {
    let spec = LimitSpec {
        per_agent: Some(100),
        ..spec(Some(100), None, None)
    };
    let mut ledger = Ledger::default();
    let ops: Vec<Op> = (0..64).map(|n| acquire(n + 1, 0, 0, 0)).collect();
    let outcomes = ledger.apply(&spec, &ops, 0);
    assert!(
        outcomes.iter().all(|o| matches!(o, Outcome::Granted(_))),
        "{outcomes:?}"
    );
    assert_eq!(ledger.leases.len(), 64);
}
