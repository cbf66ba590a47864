//! The exception hierarchy: every refusal of memplug is a `MemplugError`
//! carrying `status` (the status's name) and a message; the subclasses
//! say which kind of refusal it was, and `OutOfBudget` carries the figures
//! of the pool that was short.

use memplug_host::dlpack::ExportError;
use memplug_host::governor::GovernorError;
use memplug_host::{
    BindingError, CallError, LifeState, LifecycleError, LoadError as HostLoadError, ManagerError,
    RegistryError, Status, TerminateError,
};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(memplug, MemplugError, PyException, "A refusal of memplug; `status` names its status.");
create_exception!(
    memplug,
    OutOfBudget,
    MemplugError,
    "The pool had no room after pressure: `requested`, `used`, `capacity` (bytes), `pool`, `alloc_class`."
);
create_exception!(memplug, DeviceLost, MemplugError, "The memory's device was lost.");
create_exception!(memplug, Unsupported, MemplugError, "The mechanism lacks what the call needs.");
create_exception!(memplug, InvalidArgument, MemplugError, "A malformed request (size, layout, name).");
create_exception!(
    memplug,
    InvalidState,
    MemplugError,
    "The object is in the wrong state (freed, exported, ...)."
);
create_exception!(memplug, LoadError, MemplugError, "A plugin could not be loaded or registered.");
create_exception!(memplug, ExportRefused, MemplugError, "A DLPack export was refused.");

/// Registers the classes in the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("MemplugError", py.get_type::<MemplugError>())?;
    m.add("OutOfBudget", py.get_type::<OutOfBudget>())?;
    m.add("DeviceLost", py.get_type::<DeviceLost>())?;
    m.add("Unsupported", py.get_type::<Unsupported>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("InvalidState", py.get_type::<InvalidState>())?;
    m.add("LoadError", py.get_type::<LoadError>())?;
    m.add("ExportRefused", py.get_type::<ExportRefused>())?;
    Ok(())
}

/// An exception of class `E` with `status` set (and any more attributes).
pub(crate) fn raise<E: pyo3::PyTypeInfo>(status: &str, message: String, attrs: &[(&str, u64)]) -> PyErr {
    Python::with_gil(|py| {
        let err = PyErr::from_type(py.get_type::<E>(), message);
        let value = err.value(py);
        let _ = value.setattr("status", status);
        for (k, v) in attrs {
            let _ = value.setattr(*k, *v);
        }
        err
    })
}

fn status_name(s: Status) -> String {
    // The ABI constant's name without its prefix, in upper case.
    let debug = format!("{s:?}");
    let mut out = String::new();
    for (i, c) in debug.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// `InvalidState` for a handle used after it was released.
pub fn released(what: &str) -> PyErr {
    raise::<InvalidState>("INVALID_STATE", format!("the {what} was released"), &[])
}

/// `InvalidState` with a message.
pub fn state(message: String) -> PyErr {
    raise::<InvalidState>("INVALID_STATE", message, &[])
}

/// `Unsupported` with a message.
pub fn unsupported(message: String) -> PyErr {
    raise::<Unsupported>("UNSUPPORTED", message, &[])
}

/// `InvalidArgument` with a message.
pub fn invalid(message: String) -> PyErr {
    raise::<InvalidArgument>("INVALID_ARGUMENT", message, &[])
}

pub fn governor(e: GovernorError) -> PyErr {
    match &e {
        GovernorError::OutOfBudget(o) => {
            let s = &o.snapshot;
            let err = raise::<OutOfBudget>(
                "OUT_OF_BUDGET",
                e.to_string(),
                &[("requested", o.requested), ("used", s.used), ("capacity", s.capacity)],
            );
            Python::with_gil(|py| {
                let v = err.value(py);
                let _ = v.setattr("pool", &*s.name);
                let _ = v.setattr("alloc_class", o.class.name());
            });
            err
        }
        _ => raise::<InvalidState>("INVALID_STATE", e.to_string(), &[]),
    }
}

/// A refused plugin call (or a host check before one), by its status.
pub fn call(c: CallError) -> PyErr {
    let name = status_name(c.status);
    match c.status {
        Status::DeviceLost => raise::<DeviceLost>(&name, c.to_string(), &[]),
        Status::Unsupported => raise::<Unsupported>(&name, c.to_string(), &[]),
        Status::InvalidArgument => raise::<InvalidArgument>(&name, c.to_string(), &[]),
        Status::InvalidState => raise::<InvalidState>(&name, c.to_string(), &[]),
        _ => raise::<MemplugError>(&name, c.to_string(), &[]),
    }
}

pub fn binding(e: BindingError) -> PyErr {
    match e {
        BindingError::Budget(g) => governor(g),
        BindingError::Plugin(c) => call(c),
        e @ BindingError::Unsupported { .. } => raise::<Unsupported>("UNSUPPORTED", e.to_string(), &[]),
        BindingError::Invalid(m) => raise::<InvalidArgument>("INVALID_ARGUMENT", m, &[]),
        BindingError::State(m) => raise::<InvalidState>("INVALID_STATE", m, &[]),
    }
}

/// A manager's refusal, with the status the C API gives the same refusal
/// (docs/CONTRACT.md, "Host statuses").
pub fn manager(e: ManagerError) -> PyErr {
    let text = e.to_string();
    match e {
        ManagerError::Governor(g) => governor(g),
        ManagerError::Load(HostLoadError::VersionMismatch { .. }) => {
            raise::<LoadError>("VERSION_MISMATCH", text, &[])
        }
        ManagerError::Load(_) => raise::<LoadError>("LOAD_FAILED", text, &[]),
        ManagerError::ContextEnded { state: LifeState::Lost, .. } => {
            raise::<DeviceLost>("DEVICE_LOST", text, &[])
        }
        ManagerError::ContextEnded { .. } => raise::<InvalidState>("INVALID_STATE", text, &[]),
        ManagerError::HolderNotInPool { .. } | ManagerError::CacheHolder { .. } | ManagerError::Cache(_) => {
            raise::<InvalidArgument>("INVALID_ARGUMENT", text, &[])
        }
        ManagerError::Registry(r) => match r {
            RegistryError::DuplicatePlugin(_) => raise::<MemplugError>("ALREADY_EXISTS", text, &[]),
            RegistryError::UnknownPlugin(_)
            | RegistryError::UnknownMechanism(_)
            | RegistryError::NoDevice { .. } => raise::<MemplugError>("NOT_FOUND", text, &[]),
            RegistryError::MissingCapability { .. } => raise::<Unsupported>("UNSUPPORTED", text, &[]),
            RegistryError::UnloadRefused { .. } => raise::<MemplugError>("BUSY", text, &[]),
        },
        ManagerError::Lifecycle(l) => match l {
            LifecycleError::NotActive { .. } => raise::<InvalidState>("INVALID_STATE", text, &[]),
            LifecycleError::WrongDevice { .. } => raise::<MemplugError>("WRONG_DEVICE", text, &[]),
            LifecycleError::SameContext(_) => raise::<InvalidArgument>("INVALID_ARGUMENT", text, &[]),
        },
        ManagerError::Terminate(t) => match t {
            TerminateError::Active { .. } | TerminateError::AlreadyTerminated { .. } => {
                raise::<InvalidState>("INVALID_STATE", text, &[])
            }
            TerminateError::InFlight { .. } => raise::<MemplugError>("TIMEOUT", text, &[]),
            TerminateError::StillLive { .. } => raise::<MemplugError>("BUSY", text, &[]),
        },
    }
}

pub fn export(e: ExportError) -> PyErr {
    match &e {
        ExportError::Lost { .. } => raise::<DeviceLost>("DEVICE_LOST", e.to_string(), &[]),
        ExportError::NotDlpackDevice { .. } | ExportError::NotCopyable { .. } => {
            raise::<ExportRefused>("UNSUPPORTED", e.to_string(), &[])
        }
        ExportError::Layout(_) => raise::<ExportRefused>("INVALID_ARGUMENT", e.to_string(), &[]),
        ExportError::OutOfBounds { needed, available } => raise::<ExportRefused>(
            "OUT_OF_RANGE",
            e.to_string(),
            &[("needed", *needed), ("available", *available)],
        ),
    }
}
