# The audit's HTML page is checked in a headless browser (Debian's
# chromium), which loads it and finds every turn (cmd/turnsnap audit test).
apt_need chromium chromium
