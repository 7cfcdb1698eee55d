#!/bin/busybox sh
# PID 1 of the kubevirt-rs test guest. Kept tiny: the guest must reach a shell in ~2 s
# under TCG, and tests read its console output line by line.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
for m in $(cat /etc/modules-order); do insmod "/lib/modules/$m" 2>/dev/null; done
# The ACPI power button is how the launcher asks for a graceful shutdown; there is no
# acpid, so block on the button's event device and power off when it fires.
# kubevirt-rs.ignore-acpi on the command line makes a guest that ignores it (tests of
# the forced stop after the grace period).
grep -q kubevirt-rs.ignore-acpi /proc/cmdline ||
for d in /sys/class/input/input*; do
    if grep -q "Power Button" "$d/name" 2>/dev/null; then
        ev=$(ls "$d" | grep '^event' | head -n 1)
        if [ -n "$ev" ]; then
            # Open the device before the banner, so a press right after it is queued
            # rather than lost while the watcher starts.
            exec 3<"/dev/input/$ev"
            ( head -c 24 <&3 >/dev/null
              echo "kubevirt-rs guest: power button, shutting down"
              sync; poweroff -f ) &
            exec 3<&-
        fi
    fi
done

# Network: every NIC gets its address by DHCP, as a cloud image's would. udhcpc tries in
# the foreground first (a lease is there before the banner, so tests can use the network as
# soon as they see it) and keeps trying in the background when nobody answers yet.
ip link set lo up
mkdir -p /www
cat >/etc/udhcpc.script <<'SCRIPT'
#!/bin/sh
ev=$1
case "$ev" in
    deconfig) ip addr flush dev "$interface"; ip link set "$interface" up ;;
    bound|renew)
        ip addr show dev "$interface" | grep -q "inet $ip/" || {
            ip addr flush dev "$interface"
            ip addr add "$ip/${mask:-24}" dev "$interface"
        }
        [ -n "$mtu" ] && ip link set "$interface" mtu "$mtu"
        if [ -n "$router" ]; then
            set -- $router
            ip route replace default via "$1" dev "$interface"
        fi
        : >/etc/resolv.conf
        [ -n "$domain" ] && echo "search $domain" >>/etc/resolv.conf
        for d in $dns; do echo "nameserver $d" >>/etc/resolv.conf; done
        [ "$ev" = renew ] || echo "kubevirt-rs guest: $interface $ip/${mask:-24} gw ${router:-none}" >/dev/console ;;
esac
exit 0
SCRIPT
chmod +x /etc/udhcpc.script
for n in /sys/class/net/*; do
    i=${n##*/}
    [ "$i" = lo ] && continue
    ip link set "$i" up
    udhcpc -i "$i" -s /etc/udhcpc.script -b -t 3 -T 1 -A 2 >/dev/null 2>&1
done
# A web server on port 80 answering with the guest's addresses: network tests need a
# service in the guest, and its reply names the guest they reached.
ip -4 -o addr show scope global >/www/index.html
echo "kubevirt-rs guest" >>/www/index.html
# 100 MiB of zeros to download (a hole in tmpfs: no guest memory), for throughput figures.
truncate -s 100M /www/zeros
httpd -p 80 -h /www
# A UDP service (busybox has none): port 7 sends every datagram back.
udp-echo 7 &
# The network benchmark's guest carries iperf3 (ensure_with); the everyday one does not.
[ -x /bin/iperf3 ] && iperf3 -s -D >/dev/null 2>&1

# kubevirt-rs.fake-agent: a stand-in for qemu-guest-agent, started only on request (and
# before the banner, so it listens once the guest is up) so that other guests have none.
# Opening the agent's virtio-serial port is what libvirt reports as a connected agent; it
# answers libvirt's guest-sync and reboots on any guest-shutdown (the mode is not read).
# Anything else gets CommandNotFound.
# virtio_console adds and names its ports from the host's control messages, not within
# insmod; they are there by now on every boot seen, but on a busy host they may come late,
# so the port is looked for for up to 5 s.
# A read of the port returns end-of-file while nothing is connected on the host side, and
# libvirt connects to the channel only once QEMU reports the port open. So, like qemu-ga,
# the stand-in keeps the port open and reads again a moment later: ending at that first
# end-of-file closed the port right after opening it, and libvirt saw the agent connect
# and vanish (QEMU reports the close up to a second late, so a poll could catch it
# "connected" and a reboot through it fail).
if grep -q kubevirt-rs.fake-agent /proc/cmdline; then
    agent=
    for i in $(seq 50); do
        for p in /sys/class/virtio-ports/*; do
            [ "$(cat "$p/name" 2>/dev/null)" = org.qemu.guest_agent.0 ] && agent=/dev/${p##*/}
        done
        [ -c "$agent" ] && break
        agent=
        sleep 0.1
    done
    if [ -z "$agent" ]; then
        echo "kubevirt-rs guest: guest agent: no org.qemu.guest_agent.0 port"
    else
        ( exec <>"$agent" >&0
          while :; do
              read -r req || { sleep 0.2; continue; }
              case "$req" in
                  *guest-sync*)
                      id=$(echo "$req" | sed 's/.*"id"[^0-9]*\([0-9]*\).*/\1/')
                      echo "{\"return\": $id}" ;;
                  *guest-shutdown*)
                      echo "kubevirt-rs guest: guest agent: rebooting" >/dev/console
                      sync; reboot -f ;;
                  *) echo '{"error": {"class": "CommandNotFound", "desc": "fake agent"}}' ;;
              esac
          done ) &
    fi
fi

echo "kubevirt-rs guest ready"

# Test hooks on the kernel command line: a guest that powers itself off cleanly, or one
# whose kernel panics (reported through a panic device, if the VM has one), N seconds
# after the banner; one that fetches a URL once (network tests: the guest reaches out).
for a in $(cat /proc/cmdline); do
    case "$a" in
        kubevirt-rs.poweroff-after=*)
            ( sleep "${a#*=}"; echo "kubevirt-rs guest: powering off"; sync; poweroff -f ) & ;;
        kubevirt-rs.listen=*)
            # One more web server: network tests need a port that must not be reached.
            httpd -p "${a#*=}" -h /www ;;
        kubevirt-rs.fetch=*)
            # nc, not wget: static busybox's wget crashes looking up the "http" service
            # without an NSS configuration.
            ( t=${a#*=}
              r=$(printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 "${t%:*}" "${t##*:}" 2>&1 | tail -n 1)
              echo "kubevirt-rs guest: fetched $t: $r" ) & ;;
        kubevirt-rs.panic-after=*)
            ( sleep "${a#*=}"; echo "kubevirt-rs guest: panicking"; echo c >/proc/sysrq-trigger ) & ;;
    esac
done

# cloud-init NoCloud: print what the config drive carries so tests can see it arrive.
dev=$(findfs LABEL=cidata 2>/dev/null)
if [ -z "$dev" ]; then
    for d in /dev/vd? /dev/sd? /dev/sr?; do
        [ -b "$d" ] || continue
        if mount -t iso9660 -o ro "$d" /mnt 2>/dev/null; then
            if [ -f /mnt/meta-data ]; then dev=$d; umount /mnt; break; fi
            umount /mnt
        fi
    done
fi
mkdir -p /root/.ssh /etc/dropbear && chmod 700 /root /root/.ssh
if [ -n "$dev" ] && mount -t iso9660 -o ro "$dev" /mnt 2>/dev/null; then
    echo "kubevirt-rs cidata: $dev"
    [ -f /mnt/user-data ] && { echo "--- user-data"; cat /mnt/user-data; echo; echo "--- end user-data"; }
    # As a cloud image does: root may log in with the keys of the #cloud-config
    # document's ssh_authorized_keys list; no key is baked into the image.
    [ -f /mnt/user-data ] && awk '
        /^ssh_authorized_keys:/ { keys = 1; next }
        keys && /^[ \t]*-[ \t]/ { sub(/^[ \t]*-[ \t]*/, ""); gsub(/^"|"$/, ""); print; next }
        keys && /^[^ \t-]/ { keys = 0 }
    ' /mnt/user-data >/root/.ssh/authorized_keys
    chmod 600 /root/.ssh/authorized_keys 2>/dev/null
    umount /mnt
fi
# SSH on port 22 (dropbear; host keys made on first use).
[ -x /bin/dropbear ] && dropbear -R -p 22 2>/dev/null

export PS1='guest# '
while true; do
    setsid cttyhack sh -i </dev/ttyS0 >/dev/ttyS0 2>&1
done
