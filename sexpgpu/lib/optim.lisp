;;;; sexpgpu/optim -- optimizers and schedules, written with defoptimizer.
;;;;
;;;; (require "sexpgpu/optim" :as optim), then (optim:sgd :lr 0.1) in defgroups.
;;;;
;;;; Optimizers: sgd momentum adam adamw lion rmsprop. Each takes :lr as a number or a
;;;; schedule; (schedule lr ctx) turns it into the staged learning rate of the step.
;;;; Schedules: constant warmup-linear warmup-cosine step-decay. A schedule is a function of
;;;; the 0-based step (a staged f32 scalar while the update is traced, or a plain number), so
;;;; step 0 is the first update, as with torch's LambdaLR.

;;; Helpers: staged or plain numbers alike

(defun %sign (x)
  ;; -1, 0 or 1, like torch.sign
  (if (tensorp x) (- (cast (> x 0) (dtype x)) (cast (< x 0) (dtype x))) (signum x)))

(defun %floor-nonnegative (x)
  ;; floor of a non-negative value; a staged one is truncated through an integer cast
  (if (tensorp x) (cast (cast x :i32) (dtype x)) (values (floor x))))

(defun %decay (param rate weight-decay)
  ;; decoupled weight decay: param (1 - rate wd)
  (if (zerop weight-decay) param (- param (* rate weight-decay param))))

(defun %l2 (grad param weight-decay)
  ;; L2 weight decay folded into the gradient: grad + wd param
  (if (zerop weight-decay) grad (+ grad (* weight-decay param))))

(defun %check-number (fn key value)
  (cond ((null value) (error "~a: :~(~a~) is required" fn key))
        ((not (numberp value)) (error "~a: :~(~a~) needs a number, got ~s" fn key value))))

;;; Optimizers

(defoptimizer sgd (&key lr (weight-decay 0.0))
  "Plain stochastic gradient descent, with optional L2 weight decay (torch.optim.SGD)."
  (optimizer-update (param grad ctx)
    (- param (* (schedule lr ctx) (%l2 grad param weight-decay)))))

(defoptimizer momentum (&key lr (beta 0.9) (nesterov nil))
  "Heavy-ball momentum, optionally Nesterov (torch.optim.SGD with momentum, dampening 0)."
  (defstate v :init :zeros)
  (optimizer-update (param grad ctx)
    (setf v (+ (* beta v) grad))
    (- param (* (schedule lr ctx) (if nesterov (+ grad (* beta v)) v)))))

(defoptimizer adam (&key lr (beta1 0.9) (beta2 0.999) (eps 1e-8) (weight-decay 0.0))
  "Adam with L2 weight decay added to the gradient (torch.optim.Adam, amsgrad off)."
  (defstate m :init :zeros)
  (defstate v :init :zeros)
  (optimizer-update (param grad ctx)
    (let* ((rate (schedule lr ctx)) (step (+ (ctx :step) 1)) (g (%l2 grad param weight-decay)))
      (setf m (+ (* beta1 m) (* (- 1 beta1) g)))
      (setf v (+ (* beta2 v) (* (- 1 beta2) (square g))))
      (let ((m-hat (/ m (- 1 (expt beta1 step)))) (v-hat (/ v (- 1 (expt beta2 step)))))
        (- param (/ (* rate m-hat) (+ (sqrt v-hat) eps)))))))

(defoptimizer adamw (&key lr (beta1 0.9) (beta2 0.999) (eps 1e-8) (weight-decay 0.01))
  "Adam with decoupled weight decay (torch.optim.AdamW, amsgrad off)."
  (defstate m :init :zeros)
  (defstate v :init :zeros)
  (optimizer-update (param grad ctx)
    (let* ((rate (schedule lr ctx))
           (step (+ (ctx :step) 1))
           (decayed (%decay param rate weight-decay)))
      (setf m (+ (* beta1 m) (* (- 1 beta1) grad)))
      (setf v (+ (* beta2 v) (* (- 1 beta2) (square grad))))
      (let ((m-hat (/ m (- 1 (expt beta1 step)))) (v-hat (/ v (- 1 (expt beta2 step)))))
        (- decayed (/ (* rate m-hat) (+ (sqrt v-hat) eps)))))))

(defoptimizer lion (&key lr (beta1 0.9) (beta2 0.99) (weight-decay 0.0))
  "Lion (Chen et al. 2023): param (1 - lr wd) - lr sign(beta1 m + (1 - beta1) grad), then
m = beta2 m + (1 - beta2) grad. Use a learning rate 3-10x smaller than AdamW's."
  (defstate m :init :zeros)
  (optimizer-update (param grad ctx)
    (let* ((rate (schedule lr ctx))
           (direction (%sign (+ (* beta1 m) (* (- 1 beta1) grad))))
           (decayed (%decay param rate weight-decay)))
      (setf m (+ (* beta2 m) (* (- 1 beta2) grad)))
      (- decayed (* rate direction)))))

(defoptimizer rmsprop (&key (lr 0.01) (alpha 0.99) (eps 1e-8) (weight-decay 0.0))
  "RMSprop (torch.optim.RMSprop with its defaults: no momentum, not centered), with optional
L2 weight decay added to the gradient."
  (defstate v :init :zeros)
  (optimizer-update (param grad ctx)
    (let ((g (%l2 grad param weight-decay)))
      (setf v (+ (* alpha v) (* (- 1 alpha) (square g))))
      (- param (/ (* (schedule lr ctx) g) (+ (sqrt v) eps))))))

;;; Schedules

(defun constant (lr)
  "The same learning rate at every step."
  (lambda (step) (declare (ignore step)) lr))

(defun warmup-linear (lr &key (warmup 0) total)
  "Linear warmup from 0 to LR over WARMUP steps, then linear decay to 0 at step TOTAL
(default: the run's :steps) (and 0 after): LR * min(step / warmup, (total - step) / (total - warmup)), at least 0. The lambda
of transformers' get_linear_schedule_with_warmup; step 0 has rate 0 when WARMUP > 0."
  (%check-number "warmup-linear" :warmup warmup)
  (when total (%check-number "warmup-linear" :total total))
  (when (and total (not (< -1 warmup total)))
    (error "warmup-linear: needs 0 <= :warmup < :total, got :warmup ~a :total ~a" warmup total))
  (lambda (step)
    (let* ((total (or total (run-steps))) (decay (/ (- total step) (- total warmup))))
      (* lr (max 0.0 (if (zerop warmup) decay (min (/ step warmup) decay)))))))

(defun warmup-cosine (lr &key (warmup 0) total (min-lr 0.0))
  "Linear warmup from 0 to LR over WARMUP steps, then cosine decay to MIN-LR at step TOTAL
(default: the run's :steps) (and MIN-LR after), as nanoGPT's get_lr: step < warmup: LR * step / warmup; else with
r = min(1, (step - warmup) / (total - warmup)): MIN-LR + (LR - MIN-LR) (1 + cos(pi r)) / 2."
  (%check-number "warmup-cosine" :warmup warmup)
  (when total (%check-number "warmup-cosine" :total total))
  (%check-number "warmup-cosine" :min-lr min-lr)
  (when (and total (not (< -1 warmup total)))
    (error "warmup-cosine: needs 0 <= :warmup < :total, got :warmup ~a :total ~a" warmup total))
  (lambda (step)
    ;; (1 + cos(pi r)) / 2 = sin^2(pi (1 - r) / 2): the same value without the cancellation
    ;; of 1 + cos near the end of the decay, where f32 would lose most digits
    (let* ((total (or total (run-steps)))
           (remaining (min 1.0 (max 0.0 (/ (- total step) (- total warmup)))))
           (wave (sin (* (/ pi 2) remaining)))
           (decayed (+ min-lr (* (- lr min-lr) wave wave))))
      ;; before the warmup ends the ramp is below LR, after it the ramp is above LR
      (if (zerop warmup) decayed (min (* lr (/ step warmup)) decayed)))))

(defun step-decay (lr &key every (factor 0.1))
  "LR * FACTOR^floor(step / EVERY): the rate drops by FACTOR every EVERY steps
(torch.optim.lr_scheduler.StepLR with step_size EVERY and gamma FACTOR)."
  (%check-number "step-decay" :every every)
  (%check-number "step-decay" :factor factor)
  (unless (plusp every) (error "step-decay: :every needs a positive number of steps, got ~a" every))
  (unless (plusp factor) (error "step-decay: :factor needs a positive number, got ~a" factor))
  ;; exp(n log factor), with the logarithm taken here in double precision: an f32 FACTOR
  ;; raised to a large power would carry its rounding error n times
  (let ((log-factor (log factor)))
    (lambda (step) (* lr (exp (* log-factor (%floor-nonnegative (/ step every))))))))
