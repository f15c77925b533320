"""A pool of forked workers whose task never returns, as a worker deadlocked after its fork would: the script
waits on it for ever."""

import multiprocessing
import time


def stuck(x: int) -> int:
    time.sleep(3600)
    return x


def main() -> None:
    with multiprocessing.get_context("fork").Pool(2) as pool:
        print("stuck_pool: started", flush=True)
        pool.map(stuck, range(2))


if __name__ == "__main__":
    main()
