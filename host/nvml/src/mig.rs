//! MIG devices: nvml-wrapper has no safe call for them, so this module asks NVML directly.

// The only unsafe code of the workspace: two NVML calls on handles NVML itself returned.
#![allow(unsafe_code)]

use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{NvmlLib, nvmlDevice_t, nvmlReturn_enum_NVML_SUCCESS};

use crate::inventory::MigInstance;

/// The MIG devices of a physical device in MIG mode; empty when NVML cannot list them.
pub(crate) fn instances(nvml: &Nvml, device: &nvml_wrapper::Device<'_>) -> Vec<MigInstance> {
    // SAFETY: loads the same shared library nvml-wrapper already loaded and initialised (dlopen
    // reference-counts it); the library stays loaded for the lifetime of `lib`.
    let Ok(lib) = (unsafe { NvmlLib::new("libnvidia-ml.so.1") }) else {
        return Vec::new();
    };
    let (Ok(max_count), Ok(by_index)) =
        (lib.nvmlDeviceGetMaxMigDeviceCount.as_ref(), lib.nvmlDeviceGetMigDeviceHandleByIndex.as_ref())
    else {
        return Vec::new();
    };
    // SAFETY: `device.handle()` is a live handle of the initialised session `nvml`.
    let parent = unsafe { device.handle() };
    let mut count = 0u32;
    // SAFETY: valid handle and out-pointer.
    if unsafe { max_count(parent, &mut count) } != nvmlReturn_enum_NVML_SUCCESS {
        return Vec::new();
    }
    let mut out = Vec::new();
    for index in 0..count {
        let mut handle: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: valid handle, index below the maximum, valid out-pointer. Slots without a MIG
        // device return NOT_FOUND and are skipped.
        if unsafe { by_index(parent, index, &mut handle) } != nvmlReturn_enum_NVML_SUCCESS {
            continue;
        }
        // SAFETY: `handle` was just returned by NVML for this session and outlives this loop body.
        let mig = unsafe { nvml_wrapper::Device::new(handle, nvml) };
        if let Ok(uuid) = mig.uuid() {
            out.push(MigInstance { uuid, memory_bytes: mig.memory_info().map(|m| m.total).unwrap_or(0) });
        }
    }
    out
}
