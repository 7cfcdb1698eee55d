//! `expose`: a Service in front of a VM's launcher pod, as virtctl's. The Service selects
//! the pod by the label every launcher pod of the VMI carries (`vm.kubevirt.io/name`), so
//! it follows the VM across restarts and live migrations.

use std::collections::BTreeMap;
use std::io::Write;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::PostParams;

use crate::connect::Session;
use crate::error::{CliError, Target, from_kube};
use crate::ops::ObjectKind;

/// Label of launcher pods naming their VMI (a VM's VMI has the VM's name).
pub const VM_NAME_LABEL: &str = "vm.kubevirt.io/name";

/// What `expose` is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expose {
    pub kind: ObjectKind,
    pub name: String,
    pub service_name: String,
    pub port: u16,
    pub target_port: Option<String>,
    pub type_: String,
    pub protocol: String,
}

impl Expose {
    /// The Service (pure).
    pub fn service(&self, namespace: &str) -> Result<Service, CliError> {
        let type_ = match self.type_.as_str() {
            "ClusterIP" | "NodePort" | "LoadBalancer" => self.type_.clone(),
            other => {
                return Err(CliError::Usage(format!(
                    "--type {other:?}: ClusterIP, NodePort or LoadBalancer"
                )));
            }
        };
        let protocol = self.protocol.to_ascii_uppercase();
        if protocol != "TCP" && protocol != "UDP" {
            return Err(CliError::Usage(format!(
                "--protocol {:?}: TCP or UDP",
                self.protocol
            )));
        }
        if self.port == 0 {
            return Err(CliError::Usage("--port: 1-65535".into()));
        }
        let target_port = match self.target_port.as_deref() {
            None => IntOrString::Int(i32::from(self.port)),
            Some(t) => match t.parse::<u16>() {
                Ok(0) => return Err(CliError::Usage("--target-port: 1-65535 or a name".into())),
                Ok(p) => IntOrString::Int(i32::from(p)),
                Err(_) => IntOrString::String(t.to_owned()),
            },
        };
        Ok(Service {
            metadata: ObjectMeta {
                name: Some(self.service_name.clone()),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(type_),
                selector: Some(BTreeMap::from([(
                    VM_NAME_LABEL.to_owned(),
                    self.name.clone(),
                )])),
                ports: Some(vec![ServicePort {
                    port: i32::from(self.port),
                    target_port: Some(target_port),
                    protocol: Some(protocol),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            status: None,
        })
    }
}

/// Creates the Service after checking that the VM or VMI exists.
pub async fn run(session: &Session, e: &Expose, out: &mut dyn Write) -> Result<(), CliError> {
    crate::request::validate_name("name", &e.name)?;
    crate::request::validate_name("--name", &e.service_name)?;
    let svc = e.service(&session.namespace)?;
    let kind = match e.kind {
        ObjectKind::Vm => {
            crate::ops::get_vm(session, &e.name).await?;
            "vm"
        }
        ObjectKind::Vmi => {
            let api: Api<kubevirt_api::VirtualMachineInstance> =
                Api::namespaced(session.client.clone(), &session.namespace);
            api.get(&e.name).await.map_err(|err| {
                from_kube(
                    &target(session, "VMI", "virtualmachineinstances", "get", &e.name),
                    &session.server,
                    err,
                )
            })?;
            "vmi"
        }
    };
    let api: Api<Service> = Api::namespaced(session.client.clone(), &session.namespace);
    api.create(&PostParams::default(), &svc)
        .await
        .map_err(|err| {
            from_kube(
                &target(session, "Service", "services", "create", &e.service_name),
                &session.server,
                err,
            )
        })?;
    writeln!(
        out,
        "Service {} successfully exposed for {kind} {}",
        e.service_name, e.name
    )
    .map_err(|err| CliError::io("writing output", err))
}

fn target(
    session: &Session,
    kind: &'static str,
    resource: &'static str,
    verb: &'static str,
    name: &str,
) -> Target {
    Target {
        kind,
        group: if kind == "Service" {
            ""
        } else {
            kubevirt_api::GROUP
        },
        resource,
        subresource: None,
        verb,
        action: verb,
        name: name.to_owned(),
        namespace: session.namespace.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expose() -> Expose {
        Expose {
            kind: ObjectKind::Vm,
            name: "web".into(),
            service_name: "web-http".into(),
            port: 8080,
            target_port: Some("80".into()),
            type_: "NodePort".into(),
            protocol: "tcp".into(),
        }
    }

    #[test]
    fn service_selects_the_launcher_pod_of_the_vm() {
        let svc = serde_json::to_value(expose().service("dev").unwrap()).unwrap();
        assert_eq!(
            svc["spec"],
            serde_json::json!({
                "type": "NodePort",
                "selector": {"vm.kubevirt.io/name": "web"},
                "ports": [{"port": 8080, "targetPort": 80, "protocol": "TCP"}]
            })
        );
        assert_eq!(svc["metadata"]["namespace"], "dev");
        let named = Expose {
            target_port: Some("http".into()),
            ..expose()
        };
        assert_eq!(
            serde_json::to_value(named.service("dev").unwrap()).unwrap()["spec"]["ports"][0]["targetPort"],
            "http"
        );
        for bad in [
            Expose {
                type_: "External".into(),
                ..expose()
            },
            Expose {
                protocol: "sctp".into(),
                ..expose()
            },
            Expose {
                port: 0,
                ..expose()
            },
        ] {
            assert!(bad.service("dev").is_err(), "{bad:?}");
        }
    }
}
