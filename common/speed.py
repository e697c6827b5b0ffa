"""train.py's speed meter: ms/iter, MFU and the ETA of the progress line, against a peak FLOP/s (a known GPU's
datasheet, else a matmul measured on this machine)."""

import time

import common.hardware as hardware

# as bench.py says it: a peak measured here is only as good as the machine was quiet
MEASURED_PEAK_CAVEAT = ("MFU is against a matmul measured on this machine, not a datasheet: under load (another job on "
                        "these cores) the peak reads low and MFU high, so MFU is not trustworthy then; give "
                        "--peak_flops for a fixed one")


def peak_for_mfu(peak_flops, device, dtype):
    """(FLOP/s, measured?): the given peak_flops, else the datasheet's or a measured matmul, said in a line (a
    measured one with bench.py's caveat). A CPU has no datasheet peak and its measured one swings with the other
    jobs on its cores (MFU read 57% under load): there the peak only sizes estimates and no MFU is shown."""
    if peak_flops > 0:
        return peak_flops, False
    on_cpu = device.startswith('cpu')  # there a tenth of a second: it sizes estimates, and every run waits for it
    peak, how = hardware.peak_flops(device, dtype, seconds=0.1 if on_cpu else 0.3)
    if on_cpu:
        print("no MFU on a CPU without a known peak: give --peak_flops (FLOP/s) for one")
        return peak, True
    print(f"peak {peak / 1e12:.3g} TFLOP/s for MFU ({how})")
    measured = how.startswith('measured')
    if measured:
        print(MEASURED_PEAK_CAVEAT)
    return peak, measured


class Speed:
    """ms/iter, MFU and the ETA of the logged steps, past this process's first ones (warm-up, compilation). A
    peak measured at start may have been slowed by another job: MFU over 100% measures it again (3 times).
    model: what estimate_mfu counts (the raw model); batch: this process's rows per iteration."""

    def __init__(self, model, batch, device, dtype, peak, measured):
        self.model, self.batch, self.device, self.dtype = model, batch, device, dtype
        self.peak, self.measured, self.remeasured = peak, measured, 0
        self.mfu, self.recent_dt = -1.0, []
        self.show_mfu = not (measured and device.startswith('cpu'))  # peak_for_mfu's rule

    def update(self, dt):
        self.recent_dt = (self.recent_dt + [dt])[-20:]
        mfu = self.model.estimate_mfu(self.batch, dt, self.peak)  # per device
        if mfu > 1 and self.measured and self.show_mfu and self.remeasured < 3:
            self.remeasured += 1
            self.peak = max(self.peak, hardware.measure_matmul_flops(self.device, hardware.DTYPES[self.dtype]))
            mfu, self.mfu = self.model.estimate_mfu(self.batch, dt, self.peak), -1.0
        self.mfu = mfu if self.mfu == -1.0 else 0.9 * self.mfu + 0.1 * mfu

    def line(self, iters_left):
        """'mfu ..., eta ...' for the progress line ('eta ...' alone where no MFU is shown)."""
        eta = time.strftime('%H:%M:%S', time.gmtime(sum(self.recent_dt) / len(self.recent_dt) * iters_left)) \
            if self.recent_dt else '--:--:--'
        if not self.show_mfu:
            return f"eta {eta}"
        mfu = '--' if self.mfu < 0 else f'{self.mfu * 100:.2f}%' + (
            ' (over 100%: the peak is too low, set --peak_flops)' if self.mfu > 1 else '')
        return f"mfu {mfu}, eta {eta}"
