//! VirtualMachineInstance controller (pod rendering so far; the reconciler that
//! creates launcher pods and drives the VMI phase is still to come).

pub mod render;

#[cfg(test)]
mod golden_tests;
