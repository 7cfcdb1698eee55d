//! In-memory [`Backend`] for unit tests of the launcher's lifecycle logic: records every
//! call and simulates a guest that honours (or ignores) the ACPI power button.

use std::sync::{Arc, Mutex, mpsc};

use virt_domain::protocol::DomainState;

use crate::actor::{
    Backend, JobReport, LibvirtError, MigrateJob, MigrationResult, MigrationWaker, Observed,
    StatsSource, Versions,
};

/// Shared, inspectable state of a [`FakeBackend`].
#[derive(Debug, Default)]
pub struct FakeState {
    /// Calls in order (`define`, `start`, `shutdown`, …).
    pub calls: Vec<&'static str>,
    /// Current domain state.
    pub state: DomainState,
    /// The guest ignores the power button.
    pub ignore_acpi: bool,
    /// Crash reason to report on the next observation.
    pub crash: Option<String>,
    /// The running migration's result channel: a test ends the migration through it.
    pub migration_result: Option<mpsc::Sender<MigrationResult>>,
    /// Job statistics the running migration reports next.
    pub job_reports: Vec<JobReport>,
    /// The vCPUs the guest was last given by `set_vcpus`.
    pub vcpus: Option<u32>,
}

/// A fake libvirt.
#[derive(Clone, Debug, Default)]
pub struct FakeBackend(pub Arc<Mutex<FakeState>>);

impl FakeBackend {
    fn with<T>(&self, f: impl FnOnce(&mut FakeState) -> T) -> T {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g)
    }

    /// Recorded calls.
    pub fn calls(&self) -> Vec<&'static str> {
        self.with(|s| s.calls.clone())
    }
}

impl Backend for FakeBackend {
    fn versions(&self) -> Versions {
        Versions {
            libvirt: "fake".into(),
            qemu: "fake".into(),
            daemon_pid: None,
        }
    }
    fn define(&mut self, _xml: &str) -> Result<(), LibvirtError> {
        self.with(|s| s.calls.push("define"));
        Ok(())
    }
    fn start(&mut self) -> Result<(), LibvirtError> {
        self.with(|s| {
            s.calls.push("start");
            s.state = DomainState::Running;
        });
        Ok(())
    }
    fn shutdown(&mut self) -> Result<(), LibvirtError> {
        self.with(|s| {
            s.calls.push("shutdown");
            if !s.ignore_acpi {
                s.state = DomainState::Shutoff;
            }
        });
        Ok(())
    }
    fn reboot(&mut self) -> Result<(), LibvirtError> {
        self.with(|s| s.calls.push("reboot"));
        Ok(())
    }
    fn reset(&mut self) -> Result<(), LibvirtError> {
        self.with(|s| s.calls.push("reset"));
        Ok(())
    }
    fn destroy(&mut self) -> Result<(), LibvirtError> {
        self.with(|s| {
            s.calls.push("destroy");
            s.state = DomainState::Shutoff;
        });
        Ok(())
    }
    fn suspend(&mut self) -> Result<(), LibvirtError> {
        self.with(|s| {
            s.calls.push("suspend");
            s.state = DomainState::Paused;
        });
        Ok(())
    }
    fn resume(&mut self) -> Result<(), LibvirtError> {
        self.with(|s| {
            s.calls.push("resume");
            s.state = DomainState::Running;
        });
        Ok(())
    }
    fn set_vcpus(&mut self, vcpus: u32) -> Result<(), LibvirtError> {
        self.with(|s| {
            s.calls.push("set_vcpus");
            s.vcpus = Some(vcpus);
        });
        Ok(())
    }
    fn observe(&mut self) -> Option<Observed> {
        self.with(|s| match s.crash.take() {
            Some(r) => {
                s.state = DomainState::Crashed;
                Some(Observed {
                    state: DomainState::Crashed,
                    reason: Some(r),
                    agent_connected: false,
                })
            }
            None => Some(Observed {
                state: s.state,
                reason: None,
                agent_connected: false,
            }),
        })
    }
    fn start_migration(
        &mut self,
        _job: &MigrateJob,
        _wake: MigrationWaker,
    ) -> Result<mpsc::Receiver<MigrationResult>, LibvirtError> {
        let (tx, rx) = mpsc::channel();
        self.with(|s| {
            s.calls.push("migrate");
            s.migration_result = Some(tx);
        });
        Ok(rx)
    }
    fn migration_progress(&mut self) -> Option<JobReport> {
        self.with(|s| s.job_reports.pop())
    }
    fn stats_source(&mut self) -> Result<StatsSource, LibvirtError> {
        Ok(StatsSource::default())
    }
    fn cleanup(&mut self) {
        self.with(|s| s.calls.push("cleanup"));
    }
}
