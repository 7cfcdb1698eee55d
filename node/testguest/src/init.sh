#!/bin/busybox sh
# PID 1 of the kubevirt-rs test guest. Kept tiny: the guest must reach a shell in ~2 s
# under TCG, and tests read its console output line by line.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
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

echo "kubevirt-rs guest ready"

# Test hooks on the kernel command line: a guest that powers itself off cleanly, or one
# whose kernel panics (reported through a panic device, if the VM has one), N seconds
# after the banner.
for a in $(cat /proc/cmdline); do
    case "$a" in
        kubevirt-rs.poweroff-after=*)
            ( sleep "${a#*=}"; echo "kubevirt-rs guest: powering off"; sync; poweroff -f ) & ;;
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
if [ -n "$dev" ] && mount -t iso9660 -o ro "$dev" /mnt 2>/dev/null; then
    echo "kubevirt-rs cidata: $dev"
    [ -f /mnt/user-data ] && { echo "--- user-data"; cat /mnt/user-data; echo; echo "--- end user-data"; }
    umount /mnt
fi

export PS1='guest# '
while true; do
    setsid cttyhack sh -i </dev/ttyS0 >/dev/ttyS0 2>&1
done
