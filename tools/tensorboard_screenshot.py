"""Re-make docs/img/tensorboard_early_stopping.png: a real TensorBoard page over phalanx's logs.

    python tools/tensorboard_screenshot.py

Runs tests/lightning/scripts/early_stopping_loggers.py renamed to phalanx (one process), serves its
TensorBoard logs with the ``tensorboard`` command and photographs the Scalars page with headless
chromium (Debian: ``apt-get install chromium``). Needs ``phalanx-core[tensorboard]``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img" / "tensorboard_early_stopping.png"
PORT = 6106
PAGE = (
    f"http://localhost:{PORT}/?darkMode=false#scalars&_smoothingWeight=0"
    "&tagFilter=val_loss%7Clr-SGD%7Ctrain_loss_step&_ignoreYOutliers=false"
)


def main() -> int:
    sys.path.insert(0, str(ROOT / "tests" / "lightning"))
    from rename import to_phalanx

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("chromium not found; fix: apt-get install chromium", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as work:
        script = Path(work, "script.py")
        source = (ROOT / "tests" / "lightning" / "scripts" / "early_stopping_loggers.py").read_text(encoding="utf-8")
        script.write_text(to_phalanx(source), encoding="utf-8")
        run = Path(work, "run")
        subprocess.run([sys.executable, str(script), "--root", str(run), "--out", str(Path(work, "r.json"))], check=True)
        server = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(run / "tb"), "--port", str(PORT)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(60):  # wait until it serves
                try:
                    urllib.request.urlopen(f"http://localhost:{PORT}", timeout=1)
                    break
                except OSError:
                    time.sleep(0.5)
            subprocess.run(
                [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 "--window-size=1500,900", "--virtual-time-budget=40000", f"--screenshot={OUT}", PAGE],
                check=True, capture_output=True, timeout=180,
            )  # fmt: skip
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
