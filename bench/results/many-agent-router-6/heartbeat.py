import time

last = time.monotonic()
while True:
    time.sleep(0.2)
    now = time.monotonic()
    gap = now - last
    if gap > 1.0:
        print(f"{time.strftime('%H:%M:%S')} gap {gap:.1f}s", flush=True)
    last = now
