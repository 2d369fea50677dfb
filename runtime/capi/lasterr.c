// The calling thread's last error message. An exported Go function runs on
// the C thread that called it (the goroutine is locked to it for the call),
// so C calls made from it see that thread's slot.
//
// The slot is heap memory behind a pthread key, not a _Thread_local array:
// the Go runtime makes this library use static TLS, and a library loaded
// late (dlopen from Python) gets only the small static-TLS surplus.
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TUTTI_ERR_CAP 4096

typedef struct {
	size_t len;
	char msg[TUTTI_ERR_CAP];
} tutti_err_slot;

static pthread_key_t tutti_err_key;
static pthread_once_t tutti_err_once = PTHREAD_ONCE_INIT;
static int tutti_err_key_ok;

static void tutti_err_init(void) { tutti_err_key_ok = pthread_key_create(&tutti_err_key, free) == 0; }

static tutti_err_slot *tutti_err_get(int create) {
	pthread_once(&tutti_err_once, tutti_err_init);
	if (!tutti_err_key_ok) {
		return NULL;
	}
	tutti_err_slot *s = pthread_getspecific(tutti_err_key);
	if (s == NULL && create) {
		s = calloc(1, sizeof *s);
		if (s != NULL && pthread_setspecific(tutti_err_key, s) != 0) {
			free(s);
			s = NULL;
		}
	}
	return s;
}

__attribute__((visibility("hidden"))) void tuttiSetError(const char *msg, size_t n) {
	tutti_err_slot *s = tutti_err_get(1);
	if (s == NULL) {
		return; // out of memory: the status code still says what happened
	}
	if (n > TUTTI_ERR_CAP - 1) {
		n = TUTTI_ERR_CAP - 1;
	}
	memcpy(s->msg, msg, n);
	s->msg[n] = 0;
	s->len = n;
}

__attribute__((visibility("hidden"))) int64_t tuttiCopyError(char *buf, uint64_t len) {
	tutti_err_slot *s = tutti_err_get(0);
	size_t have = s != NULL ? s->len : 0;
	if (buf != NULL && len > 0) {
		size_t n = have;
		if (n > len - 1) {
			n = (size_t)(len - 1);
		}
		if (n > 0) {
			memcpy(buf, s->msg, n);
		}
		buf[n] = 0;
	}
	return (int64_t)have;
}
