/*
 * nvml_stub.c - a stand-in libnvidia-ml.so.1 for test/test_cuda_trainer_sim.sh, so the -lg path
 * that loads NVML (llmc/cuda/telemetry.cuh: dlopen, symbol lookup, the device found by PCI bus
 * id, units, a failing query) runs without a GPU. Built by the script:
 *   gcc -shared -fPIC test/nvml_stub.c -o DIR/libnvidia-ml.so.1; LD_LIBRARY_PATH=DIR ...
 * It knows one device, at cudasim's bus id 0000:00:00.0, with fixed readings:
 *   SM 1755 (max 1980) MHz, memory clock 2619 MHz, 47 C, 312.4 W, utilisation 97%,
 *   reasons 0x24 (power-cap, sw-thermal);
 * the power limit query answers NVML_ERROR_NOT_SUPPORTED, and only the old name of the
 * reasons query (nvmlDeviceGetCurrentClocksThrottleReasons) exists, as in drivers before 535.
 * Return codes are nvml.h's: 0 success, 1 uninitialized, 2 invalid argument, 3 not supported,
 * 6 not found.
 */
#include <string.h>

typedef struct {
    int tag;
} StubDevice;
static StubDevice the_device = {0x5eed};
static int initialised = 0;

typedef struct {
    unsigned int gpu, memory;
} StubUtilization;

/* 0 when dev is the handle this library gave out and NVML is initialised */
static int check(const StubDevice *dev) { return !initialised ? 1 : dev != &the_device ? 2 : 0; }

int nvmlInit_v2(void) {
    initialised = 1;
    return 0;
}

int nvmlShutdown(void) {
    if (!initialised) return 1;
    initialised = 0;
    return 0;
}

const char *nvmlErrorString(int status) {
    switch (status) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 6: return "Not Found";
    default: return "Unknown Error";
    }
}

int nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, StubDevice **dev) {
    if (!initialised) return 1;
    if (!bus_id || !dev) return 2;
    if (strcmp(bus_id, "0000:00:00.0") != 0) return 6;
    *dev = &the_device;
    return 0;
}

/* clock types: 1 SM, 2 memory */
int nvmlDeviceGetClockInfo(StubDevice *dev, int type, unsigned int *mhz) {
    if (check(dev)) return check(dev);
    if (type == 1) *mhz = 1755;
    else if (type == 2) *mhz = 2619;
    else return 2;
    return 0;
}

int nvmlDeviceGetMaxClockInfo(StubDevice *dev, int type, unsigned int *mhz) {
    if (check(dev)) return check(dev);
    if (type != 1) return 3;
    *mhz = 1980;
    return 0;
}

int nvmlDeviceGetTemperature(StubDevice *dev, int sensor, unsigned int *celsius) {
    if (check(dev)) return check(dev);
    if (sensor != 0) return 2;
    *celsius = 47;
    return 0;
}

int nvmlDeviceGetPowerUsage(StubDevice *dev, unsigned int *milliwatts) {
    if (check(dev)) return check(dev);
    *milliwatts = 312400;
    return 0;
}

int nvmlDeviceGetEnforcedPowerLimit(StubDevice *dev, unsigned int *milliwatts) {
    (void)milliwatts;
    return check(dev) ? check(dev) : 3;
}

int nvmlDeviceGetUtilizationRates(StubDevice *dev, StubUtilization *u) {
    if (check(dev)) return check(dev);
    u->gpu = 97;
    u->memory = 40;
    return 0;
}

int nvmlDeviceGetCurrentClocksThrottleReasons(StubDevice *dev, unsigned long long *reasons) {
    if (check(dev)) return check(dev);
    *reasons = 0x24;
    return 0;
}
