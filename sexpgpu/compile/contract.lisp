;;;; contract.lisp -- the run-file forms, as macros over the compiler's %-builtins.
;;;;
;;;; Loaded after the prelude, into the standard library, by the compiler. Everything here
;;;; only records what the file declares; staging happens after the whole file is read.

;;; Knobs, variants, sweeps

;; the default is literal data, like defsweep values and --set: (defknob widths (2 64 3))
;; is a list, never a call
(defmacro defknob (name default &key type range choices doc)
  `(%defknob ',name ',default :type ',type :range ',range :choices ',choices :doc ,doc))

;; variant and sweep settings are literal data, read before the file is evaluated (knob
;; values are bound first); here they are only checked against the declared knobs
(defmacro defvariant (name &rest settings)
  `(%defvariant ',name ',settings))

(defmacro defsweep (name &rest settings)
  `(%defsweep ',name ',settings))

;;; Models

(defun %model-body (forms)
  ;; defparam and defpart bind their name for the rest of the body; forward records the
  ;; traced function
  (if (null forms)
      nil
      (let ((form (car forms))
            (rest (%model-body (cdr forms))))
        (cond ((and (consp form) (%name= (car form) "DEFPARAM"))
               `(let ((,(second form) (%defparam ',(second form) (list ,@(third form)) ,@(cdddr form))))
                  ,@(if rest (list rest) (list (second form)))))
              ((and (consp form) (%name= (car form) "DEFPART"))
               (let ((name (second form)) (args (gensym "ARGS")))
                 `(let ((,name (%defpart ',name (lambda () ,(third form)))))
                    (flet ((,name (&rest ,args) (%call-model ,name ,args)))
                      ,@(if rest (list rest) (list name))))))
              ((and (consp form) (%name= (car form) "FORWARD"))
               `(progn (%forward (lambda ,(second form) ,@(cddr form))) ,rest))
              (t `(progn ,form ,rest))))))

;; a model may take a name the standard library uses (runfile.md names one `block`): the
;; file's own symbol then shadows the standard one from the next form on
(defmacro defmodel (name lambda-list &body body)
  `(%defmodel-constructor
    ',name
    (lambda ,lambda-list
      (%model-scope ',name (lambda () ,(%model-body (%body-without-doc body)))))))

(defmacro defparam (name &rest args)
  ;; a direct form of a defmodel body is rewritten by %model-body; anywhere else, an error
  (declare (ignore args))
  `(%defparam-misplaced ',name))

(defmacro repeat (n form)
  `(%repeat ,n (lambda () ,form)))

(defmacro defpart (name constructor)
  `(%defpart-toplevel ',name (lambda () ,constructor)))

(defmacro tie (target source &key transpose)
  `(%tie ,target ,source ,transpose))

;;; Data

(defun %proper-list-p (x)
  (and (listp x) (ignore-errors (list-length x)) t))

;; a malformed :fields or :prepare is passed on quoted, for %defloader's C008 to name it
(defun %field-spec (spec)
  (if (and (%proper-list-p spec) (= (length spec) 3))
      (destructuring-bind (name dtype shape) spec
        `(list ',name ,dtype ,(if (%proper-list-p shape) `(list ,@shape) `',shape)))
      `',spec))

(defun %prepare-spec (step)
  ;; (normalize field) names a field; the other steps take evaluated keyword arguments
  (cond ((not (and (consp step) (%proper-list-p step))) `',step)
        ((%name= (car step) "NORMALIZE") `(list ',(car step) :field ',(second step)))
        (t `(list ',(car step) ,@(cdr step)))))

(defun %specs (specs fn)
  (if (%proper-list-p specs) `(list ,@(mapcar fn specs)) `',specs))

(defmacro defloader (name &key source prepare fields batch shuffle stages part)
  `(%defloader ',name
               :source ,source
               :prepare ,(%specs prepare #'%prepare-spec)
               :fields ,(%specs fields #'%field-spec)
               :batch ,batch
               :shuffle ,shuffle
               :part ',part
               :stages ',stages))

(defmacro field (batch name)
  `(%field ,batch ',name))

;;; Objective, metrics, evaluation

(defmacro defobjective ((batch) &body body)
  `(%defobjective (lambda (,batch) ,@body)))

(defmacro defevaluate ((batch) &body body)
  `(%defevaluate (lambda (,batch) ,@body)))

(defmacro metric (name value)
  `(%metric ',name ,value))

;;; Optimizers

(defmacro defoptimizer (name lambda-list &body body)
  (let* ((states (remove-if-not (lambda (f) (and (consp f) (%name= (car f) "DEFSTATE"))) body))
         (update (find-if (lambda (f) (and (consp f) (%name= (car f) "OPTIMIZER-UPDATE"))) body))
         (state-names (mapcar #'second states))
         (result (gensym "NEW")))
    (unless update
      (error "defoptimizer ~a: the body needs an (optimizer-update (param grad ctx) ...) form" name))
    `(defun ,name ,lambda-list
       (%make-optimizer
        ',name
        (list ,@(mapcar (lambda (s) `(list ',(second s) ,@(cddr s))) states))
        (lambda (,@(second update) ,@state-names)
          (let ((,result (progn ,@(cddr update))))
            (values ,result ,@state-names)))))))

(defmacro defgroups (&rest groups)
  (let ((clip (getf (member-if #'keywordp groups) :clip))
        (specs (loop for g in groups while (consp g) collect g)))
    `(%defgroups (list ,@(mapcar (lambda (g) `(list ',(first g) ,(second g) ,(third g) ',(nthcdr 3 g))) specs))
                 :clip ,clip)))

;;; The run

;; option values that are plists, such as :checkpoint (:every 500 :keep 3), are data
(defmacro defrun (&rest options)
  `(%defrun ,@(loop for (key value) on options by #'cddr
                    collect key
                    collect (if (and (consp value)
                                     (or (keywordp (car value))
                                         (and (member key '(:checkpoint :finite-guard :diagnostics :meta))
                                              (not (and (symbolp (car value)) (car value))))))
                                `(quote ,value)
                                value))))

;;; Evaluation passes and targets

(defmacro defeval (name &key (loader name) every at overlap)
  `(%defeval ',name :loader ',loader :every ,every :at ,at :overlap ,overlap))

;; the test is written, not computed: (deftarget val acc :>= 0.985); the value may be a knob
(defmacro deftarget (eval metric test value)
  `(%deftarget ',eval ',metric ',test ,value))

;;; Curriculum

(defun %stage-specs (forms)
  ;; (stage loader name) forms as (loader name) pairs
  (mapcar (lambda (f)
            (unless (and (consp f) (%name= (car f) "STAGE"))
              (error "defcurriculum: expected (stage loader name), got ~s" f))
            `(list ',(second f) ',(third f)))
          forms))

(defmacro defcurriculum (&rest clauses)
  `(%defcurriculum
    (list ,@(mapcar (lambda (clause)
                      (cond ((%name= (car clause) "START")
                             `(list :start nil (list ,@(%stage-specs (cdr clause)))))
                            ((%name= (car clause) "WHEN")
                             `(list :when (lambda () ,(second clause)) (list ,@(%stage-specs (cddr clause)))))
                            (t (error "defcurriculum: clauses are (start (stage ...)) and (when test (stage ...)), got ~s" clause))))
                    clauses))))

;;; Diagnostics

(defmacro defdiagnostic (name (value) &body body)
  `(%defdiagnostic ',name (lambda (,value) ,@body)))

(defmacro diagnostic (name value)
  `(%diagnostic ',name ,value))

;;; Precision

(defmacro with-numerics ((dtype) &body body)
  `(%with-numerics ,dtype (lambda () ,@body)))
