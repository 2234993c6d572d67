//! Drivers: one module per fabric, each implementing [`crate::Domain`], [`crate::Listener`]
//! and [`crate::Endpoint`].

pub mod ofi;
pub mod tcp;
