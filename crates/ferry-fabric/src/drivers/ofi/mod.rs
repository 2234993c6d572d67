//! Driver `ofi` (under construction).

use std::sync::Arc;

use crate::{Address, Domain, FabricError, Listener, Result};

/// Opens a client domain.
pub fn open(_addr: &Address) -> Result<Arc<dyn Domain>> {
    Err(FabricError::Unavailable("ofi driver not built yet".into()))
}

/// Listens on `addr`.
pub fn listen(_addr: &Address) -> Result<Box<dyn Listener>> {
    Err(FabricError::Unavailable("ofi driver not built yet".into()))
}
