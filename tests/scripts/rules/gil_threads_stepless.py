"""GD501 with no step at all: three threads share pure-Python work and the main thread waits for them.

No optimizer, DataLoader, backward() or model call, so gpudoctor finds no step: the GIL probe watches the
program on its own (gpudoctor.collect.stepless). `--threads 1` is the twin with one worker thread.
"""

import argparse
import threading
import time


def work(seconds: float, results: list[int]) -> None:
    acc, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        for i in range(10_000):  # pure Python: holds the GIL
            acc = (acc * 31 + i) % 1000003
    results.append(acc)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    results: list[int] = []
    threads = [threading.Thread(target=work, args=(args.seconds, results), name=f"worker-{n}")
               for n in range(args.threads)]
    for thread in threads:
        thread.start()  # WORKER START
    for thread in threads:
        thread.join()
    print(f"gil_threads_stepless: {len(results)} workers done")


if __name__ == "__main__":
    main()
