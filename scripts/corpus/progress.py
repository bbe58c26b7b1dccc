"""The preparation's progress: documents/s, MB/s of input read, ETA.

On a terminal one line redrawn twice a second ("bar"); otherwise a line
every 10 s ("lines"), so a log keeps a readable record."""
import sys
import time


def clock(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressLine:
    def __init__(self, mode, progress):
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode, self.progress = mode, progress
        self.start = self.last = time.monotonic()
        self.period = 0.5 if mode == "bar" else 10.0
        self.width = 0

    def text(self, docs, now):
        took = max(now - self.start, 1e-9)
        done, total = self.progress.consumed(), self.progress.total
        share = done / total if total else 1.0
        eta = clock(took * (1 - share) / share) if share > 0 else "?"
        return (f"prepare_corpus: {docs} documents, {docs / took:.0f}/s, {done / 1e6:.1f} of {total / 1e6:.1f} MB "
                f"({100 * share:.0f}%), {done / 1e6 / took:.1f} MB/s, ETA {eta}")

    def update(self, docs):
        now = time.monotonic()
        if self.mode == "none" or now - self.last < self.period:
            return
        self.last = now
        line = self.text(docs, now)
        if self.mode == "bar":
            sys.stderr.write("\r" + line.ljust(self.width))
            self.width = len(line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def finish(self):
        if self.mode == "bar" and self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()
