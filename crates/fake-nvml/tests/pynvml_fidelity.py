"""Drives the fake libnvidia-ml through NVIDIA's own Python binding (nvidia-ml-py).

Run by tests/pynvml.rs with LD_LIBRARY_PATH pointing at a directory where libnvidia-ml.so.1 is
the fake, FAKE_NVML_STATE/FAKE_NVML_GPUS describing the node, EXPECT_JSON holding the catalog's
profile tables and FAKE_NVIDIA_SMI the stand-in reset tool.
"""
import ctypes
import json
import os
import subprocess
import sys

import pynvml as n

EXPECT = json.load(open(os.environ["EXPECT_JSON"]))
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        raise AssertionError(what)


def expect_error(code, fn, *args):
    try:
        fn(*args)
    except n.NVMLError as e:
        check(e.value == code, f"{fn.__name__}: expected error {code}, got {e.value}")
        return
    raise AssertionError(f"{fn.__name__}: expected error {code}, got success")


def placements(h, profile_id):
    count = ctypes.c_uint(0)
    n.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, None, ctypes.byref(count))
    buf = (n.c_nvmlGpuInstancePlacement_t * count.value)()
    n.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, buf, ctypes.byref(count))
    return [[buf[i].start, buf[i].size] for i in range(count.value)]


def gpu_instances(h, profile_id, cap):
    count = ctypes.c_uint(cap)
    buf = (n.c_nvmlGpuInstance_t * cap)()
    n.nvmlDeviceGetGpuInstances(h, profile_id, buf, ctypes.byref(count))
    return [buf[i] for i in range(count.value)]


def compute_instances(gi, profile_id, cap):
    count = ctypes.c_uint(cap)
    buf = (n.c_nvmlComputeInstance_t * cap)()
    n.nvmlGpuInstanceGetComputeInstances(gi, profile_id, buf, ctypes.byref(count))
    return [buf[i] for i in range(count.value)]


def text(v):
    return v.decode() if isinstance(v, bytes) else v


n.nvmlInit()
gpus = EXPECT["gpus"]
check(n.nvmlDeviceGetCount() == len(gpus), "device count")
handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(len(gpus))]
for h, g in zip(handles, gpus):
    check(text(n.nvmlDeviceGetName(h)) == g["nvml_name"], f"name of {g['model']}")
    uuid = text(n.nvmlDeviceGetUUID(h))
    check(uuid.startswith("GPU-") and len(uuid) == 40, f"uuid {uuid}")
    pci = n.nvmlDeviceGetPciInfo(h)
    check(pci.pciDeviceId == g["pci_device_id"], f"pci id of {g['model']}")
    check(text(pci.busId) == g["bus_id"], "bus id")
    mem = n.nvmlDeviceGetMemoryInfo(h)
    check(mem.total == g["memory_bytes"] and mem.free + mem.used == mem.total, "memory v1")
    check(n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).total == g["memory_bytes"], "memory v2")
    check(n.nvmlDeviceGetHandleByUUID(uuid.encode()) is not None, "handle by uuid")
    # Compute mode: DEFAULT at start, EXCLUSIVE_PROCESS and back (as MPS needs); the removed
    # EXCLUSIVE_THREAD mode is NOT_SUPPORTED and an unknown value INVALID_ARGUMENT.
    check(n.nvmlDeviceGetComputeMode(h) == n.NVML_COMPUTEMODE_DEFAULT, "compute mode starts DEFAULT")
    n.nvmlDeviceSetComputeMode(h, n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    check(n.nvmlDeviceGetComputeMode(h) == n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS, "EXCLUSIVE_PROCESS set")
    expect_error(n.NVML_ERROR_NOT_SUPPORTED, n.nvmlDeviceSetComputeMode, h, n.NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
    expect_error(n.NVML_ERROR_INVALID_ARGUMENT, n.nvmlDeviceSetComputeMode, h, 7)
    n.nvmlDeviceSetComputeMode(h, n.NVML_COMPUTEMODE_DEFAULT)
    check(n.nvmlDeviceGetComputeMode(h) == n.NVML_COMPUTEMODE_DEFAULT, "DEFAULT restored")
    if not g["profiles"]:
        expect_error(n.NVML_ERROR_NOT_SUPPORTED, n.nvmlDeviceGetMigMode, h)
        continue
    check(n.nvmlDeviceGetMigMode(h) == [0, 0], "MIG starts disabled")
    # Profile info by enum index (v1 and v2 structs) and by id equals the catalog, ids are unique ids.
    by_index = {p["index"]: p for p in g["profiles"]}
    for idx in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
        if idx not in by_index:
            expect_error(n.NVML_ERROR_NOT_SUPPORTED, n.nvmlDeviceGetGpuInstanceProfileInfo, h, idx)
            continue
        p = by_index[idx]
        for version in (1, 2):
            info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, idx, version)
            got = [info.id, info.sliceCount, info.instanceCount, info.memorySizeMB, info.multiprocessorCount,
                   info.copyEngineCount, info.decoderCount, info.encoderCount, info.jpegCount, info.ofaCount]
            want = [p["id"], p["slices"], p["instance_count"], p["memory_mib"], p["multiprocessors"], p["copy_engines"],
                    p["decoders"], p["encoders"], p["jpeg"], p["ofa"]]
            check(got == want, f"{g['model']} profile {idx} v{version}: {got} != {want}")
        check(text(n.nvmlDeviceGetGpuInstanceProfileInfoById(h, p["id"]).name) == "MIG " + p["name"], "name by id")
        check(placements(h, p["id"]) == p["placements"], f"{g['model']} placements of {p['name']}")
    expect_error(n.NVML_ERROR_INVALID_ARGUMENT, n.nvmlDeviceGetGpuInstanceProfileInfo, h, n.NVML_GPU_INSTANCE_PROFILE_COUNT)

    # MIG mode: pending on Ampere until reset, immediate on Hopper.
    check(n.nvmlDeviceSetMigMode(h, 1) == n.NVML_SUCCESS, "activation status")
    if g["needs_reset"]:
        check(n.nvmlDeviceGetMigMode(h) == [0, 1], "Ampere mode pending")
        subprocess.run([os.environ["FAKE_NVIDIA_SMI"], "--gpu-reset", "-i", g["bus_id"]], check=True, capture_output=True)
    check(n.nvmlDeviceGetMigMode(h) == [1, 1], "MIG enabled")

    # Create a GI at an explicit placement with its default CI, list both, find the MIG device.
    big = max(g["profiles"], key=lambda p: (p["memory_slices"], p["slices"]))
    small = min((p for p in g["profiles"] if p["index"] == 0), key=lambda p: p["id"])
    check(n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, big["id"]) == 1, "capacity of the full profile")
    start = small["placements"][-1][0]
    gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, small["id"], ctypes.byref(n.c_nvmlGpuInstancePlacement_t(start, 1)))
    info = n.nvmlGpuInstanceGetInfo(gi)
    check(info.profileId == small["id"] and info.placement.start == start and info.placement.size == 1, "GI info")
    check(n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, big["id"]) == 0, "full profile blocked")
    check(n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, small["id"]) == small["instance_count"] - 1, "capacity")
    listed = gpu_instances(h, small["id"], small["instance_count"])
    check(len(listed) == 1 and n.nvmlGpuInstanceGetInfo(listed[0]).id == info.id, "list GIs")
    ci_info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 0)
    check(ci_info.id == 0 and ci_info.sliceCount == 1, "CI profile info")
    ci = n.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
    cinfo = n.nvmlComputeInstanceGetInfo(ci)
    check(cinfo.id == 0 and cinfo.profileId == 0 and cinfo.placement.start == 0, "CI info")
    check(len(compute_instances(gi, ci_info.id, 1)) == 1, "list CIs")
    mig = n.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    check(n.nvmlDeviceIsMigDeviceHandle(mig).value == 1, "is MIG handle")
    mig_uuid = text(n.nvmlDeviceGetUUID(mig))
    check(mig_uuid.startswith("MIG-") and len(mig_uuid) == 40, f"MIG uuid {mig_uuid}")
    check(n.nvmlDeviceGetGpuInstanceId(mig) == info.id and n.nvmlDeviceGetComputeInstanceId(mig) == 0, "MIG ids")
    check(n.nvmlDeviceGetMemoryInfo(mig).total == small["memory_mib"] * 1024 * 1024, "MIG memory")
    check(n.nvmlDeviceGetAttributes(mig).gpuInstanceSliceCount == 1, "MIG attributes")
    check(n.nvmlDeviceGetMaxMigDeviceCount(h) == g["compute_slices"], "max MIG devices")
    expect_error(n.NVML_ERROR_NOT_FOUND, n.nvmlDeviceGetMigDeviceHandleByIndex, h, 1)

    # Driver rules: overlap is INSUFFICIENT_RESOURCES; a GI with a CI is IN_USE.
    expect_error(n.NVML_ERROR_INSUFFICIENT_RESOURCES, n.nvmlDeviceCreateGpuInstanceWithPlacement, h, small["id"],
                 ctypes.byref(n.c_nvmlGpuInstancePlacement_t(start, 1)))
    expect_error(n.NVML_ERROR_INVALID_ARGUMENT, n.nvmlDeviceCreateGpuInstanceWithPlacement, h, big["id"],
                 ctypes.byref(n.c_nvmlGpuInstancePlacement_t(1, big["memory_slices"])))
    expect_error(n.NVML_ERROR_IN_USE, n.nvmlGpuInstanceDestroy, gi)
    n.nvmlComputeInstanceDestroy(ci)
    n.nvmlGpuInstanceDestroy(gi)
    check(gpu_instances(h, small["id"], small["instance_count"]) == [], "destroyed")
    expect_error(n.NVML_ERROR_NOT_FOUND, n.nvmlDeviceGetGpuInstanceById, h, info.id)

n.nvmlShutdown()
print(f"pynvml: {checks} passed, 0 failed")
