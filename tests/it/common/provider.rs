//! The reference provider served by the test process on 127.0.0.1, and its ledger read back: how
//! many charges a test caused is always read from the provider's own ledger file.

use callid::provider::{ChargeRecord, Ledger, ProviderHandle, ProviderHooks};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// Starts the provider on a free loopback port with its ledger at `ledger`.
pub async fn spawn(ledger: &Path, hooks: Option<Arc<dyn ProviderHooks>>) -> ProviderHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    callid::provider::spawn(listener, Ledger::open(ledger).unwrap(), hooks).unwrap()
}

/// Starts the provider again on `addr` (where a stopped one listened), on the same ledger.
pub async fn respawn(addr: SocketAddr, ledger: &Path) -> ProviderHandle {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    callid::provider::spawn(listener, Ledger::open(ledger).unwrap(), None).unwrap()
}

/// The charges in the ledger at `ledger`, none when no ledger was written yet.
pub fn charges(ledger: &Path) -> Vec<ChargeRecord> {
    if !ledger.exists() {
        return vec![];
    }
    Ledger::open(ledger).unwrap().charges().unwrap()
}

/// How many charges the ledger at `ledger` holds (opening it as the provider would).
pub fn charge_count(ledger: &Path) -> u64 {
    Ledger::open(ledger).unwrap().charge_count().unwrap()
}

/// How many charges the ledger at `ledger` holds, 0 when no ledger was written yet.
pub fn charge_count_or_zero(ledger: &Path) -> u64 {
    if !ledger.exists() {
        return 0;
    }
    charge_count(ledger)
}

/// The charge ids in the ledger at `ledger`, in the ledger's order.
pub fn charge_ids(ledger: &Path) -> Vec<String> {
    charges(ledger).into_iter().map(|c| c.charge_id).collect()
}
